"""Ending a training process at once, without leaving files in the temp folder.

Some processes end with os._exit: their run is over, and Python's own
finalization would only run a framework's teardown that can abort or hang
(Backend.finalizes_at_exit; a stopped survivor; a parameter server's
threads). os._exit skips every atexit hook, and TensorFlow's AutoGraph
removes the source file it writes for each function it converts
(`__autograph_generated_file*.py` in the temp folder) in such a hook, so
each of these processes left its files behind: about 2,000 in /tmp after
a day of `make test` (bench/README.md).
"""

from __future__ import annotations

import contextlib
import os
import sys

# tensorflow/python/autograph/pyct/loader.py: load_source's prefix, which it
# also makes the module's name in sys.modules.
AUTOGRAPH_SOURCE_PREFIX = "__autograph_generated_file"


def remove_file(path: str) -> None:
    """Remove `path` if it is still there (an atexit hook's removal: another
    process, or the system's cleaning of /tmp, may have been first)."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def temp_folder_until_exit(prefix: str) -> str:
    """A new folder in the temp folder, removed with what is in it when this
    process exits (an atexit hook): for what the processes a launcher waits
    for write while they run."""
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def remove_autograph_sources() -> None:
    """Remove the source files of this process's AutoGraph modules, as
    AutoGraph's own atexit hook would."""
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name.startswith(AUTOGRAPH_SOURCE_PREFIX) and path:
            remove_file(path)


def exit_now(code: int) -> None:
    """End this process at once, its output flushed and AutoGraph's sources
    removed: what Python's own finalization would still run is the teardown
    to skip."""
    import logging

    remove_autograph_sources()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
