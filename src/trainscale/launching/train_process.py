"""What one process of a run does (`trainscale train`): the role its launch
kind gave it (a parameter server serves until the chief ends), a driver's
run of workers it starts itself (Ray Train), or the training loop; and how
it ends (out of memory is an exit code the launcher reads, not a crash).
`trainscale.launching.launch` starts these processes; this is one of them.
"""

from __future__ import annotations

import os
import sys

from trainscale.catalogue.options import RunOptions
from trainscale.catalogue.registry import framework_spec
from trainscale.catalogue.settings import RunSettings
from trainscale.core.process_exit import exit_now
from trainscale.launching.launch import run_role


def train_process(settings: RunSettings, options: RunOptions) -> int:
    """`trainscale train`: this process's part of the run (a role's serving,
    a driver's run, or the training loop); its exit code (EXIT_OOM when it
    ran out of memory, a result of the grid point and not a crash)."""
    from trainscale.core.heap import pause_collection, resume_collection
    from trainscale.core.supervision import EXIT_OOM, OWN_OOM_SIGN, mark_first_to_die

    pause_collection()  # until the model is built (trainscale.core.heap says why)
    from trainscale.frameworks import backend_class
    from trainscale.harness.training import OutOfMemory, train

    spec = framework_spec(settings.framework)
    # A driver (Ray's) is a launcher of its workers: they, not it, go first.
    if not spec.driver:
        mark_first_to_die()
    if options.collective_timeout:
        # Horovod's Gloo reads its timeout from its own variable, in hvd.init().
        os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(max(1, round(options.collective_timeout)))
    role = run_role(settings)
    try:
        if role:  # a parameter server or a worker: serves until the chief ends
            resume_collection()
            _call(role, settings, options)
        elif spec.driver:
            resume_collection()
            _drive(spec.driver, settings, options)
        else:
            backend = backend_class(settings.framework)
            train(settings, backend, options)
            if not backend.finalizes_at_exit:
                exit_now(0)  # the teardown to skip (Backend.finalizes_at_exit)
    except (OutOfMemory, MemoryError) as err:
        # Running out of memory is a result of this grid point, not a crash.
        # The launcher reads this line (from any rank) and writes the record.
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        print(f"{OWN_OOM_SIGN} {first_line}", file=sys.stderr)
        return EXIT_OOM
    return 0


def _call(function: str, settings: RunSettings, options: RunOptions):
    """Run the "module:function" a registry entry or a role names."""
    import importlib

    module, name = function.split(":")
    return getattr(importlib.import_module(module), name)(settings, options)


def _drive(driver: str, settings: RunSettings, options: RunOptions) -> None:
    """A framework that starts its workers itself (Ray Train): its driver runs
    them, each running the training function, and the driver's own timings
    join the record the chief worker wrote."""
    from trainscale.core.records import atomic_write_json, read_record
    from trainscale.harness.training import OutOfMemory

    try:
        timings = _call(driver, settings, options)
    except Exception as err:
        # A worker's OutOfMemory reaches the driver wrapped in the framework's error.
        text = str(err)
        if "OutOfMemory" in text or "out of memory" in text.lower():
            line = next((x for x in text.splitlines() if "emory" in x), text.splitlines()[0])
            raise OutOfMemory(line.strip()) from err
        raise
    if timings:  # a worker node's task has none: the head's driver writes them
        atomic_write_json(options.output, {**read_record(options.output), **timings})
