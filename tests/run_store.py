"""Real runs shared by every test of a pytest run: one real run, many assertions.

A `trainscale run` is keyed by its arguments (and the environment it is given):
the first test that asks for it runs it, every other test that asks for the
same (on this pytest-xdist worker or another) waits for that run and reads its
outcome, record and weights. So "a torch-ddp run of VGG-16 on 2 CPU replicas"
is trained once, and its record checks, its equivalence to torch-single and
the examples' comparison all read it. Folders made once for everyone
(generated data sets) are shared the same way (RunStore.folder).

The store lives under the pytest run's base temporary folder, which every
xdist worker of the run shares; an flock per key makes the others wait.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass
class StoredRun:
    """A run's outcome: what the command printed, and the files it wrote."""

    args: list
    returncode: int
    stdout: str
    stderr: str
    folder: Path

    @property
    def output(self) -> Path:
        return self.folder / "record.json"

    @property
    def record(self) -> dict:
        assert self.output.exists(), f"no record: exit {self.returncode}\n{self.stderr[-3000:]}"
        return json.loads(self.output.read_text())

    def weights(self) -> tuple[list, list]:
        """The (initial, final) weights the run saved (--save-weights)."""
        import numpy as np

        with np.load(self.folder / "weights.npz") as arrays:
            count = len([k for k in arrays if k.startswith("final_")])
            return (
                [arrays[f"initial_{i}"] for i in range(count)],
                [arrays[f"final_{i}"] for i in range(count)],
            )

    @property
    def home(self) -> Path:
        """The HOME and TMPDIR of a run with private_home (nothing else writes there)."""
        return self.folder / "home"

    @property
    def temp(self) -> Path:
        return self.folder / "tmp"

    def left_in_temp(self) -> list[str]:
        """What a run with private_home left in its temp folder (Ray's session,
        AutoGraph's sources, torchrun's log folders, DataLoader workers'
        pymp-* are what have been), but torch's compile cache, which torch
        keeps on purpose (torchinductor_<user>)."""
        import getpass

        cache = f"torchinductor_{getpass.getuser()}"
        return sorted(name for name in os.listdir(self.temp) if name != cache)

    @property
    def mark(self) -> str:
        """An environment variable that only this run's processes carry."""
        return f"TRAINSCALE_TEST_MARK_{self.folder.name}"


class RunStore:
    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self, key: str):
        with open(self.root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            yield self.root / key

    def folder(self, name: str, make) -> str:
        """A folder made once for the whole pytest run by make(path)."""
        with self._locked(name) as folder:
            if not (folder / ".made").exists():
                folder.mkdir(exist_ok=True)
                make(str(folder))
                (folder / ".made").touch()
        return str(folder)

    def once(self, name: str, compute) -> dict:
        """compute()'s result (JSON), computed once for the whole pytest run."""
        with self._locked(name) as folder:
            result = folder / "result.json"
            if not result.exists():
                folder.mkdir(exist_ok=True)
                result.write_text(json.dumps(compute(str(folder))))
            return json.loads(result.read_text())

    def run(
        self,
        *args: str,
        weights: bool = False,
        private_home: bool = False,
        timeout: float = 600,
        check: bool = True,
    ) -> StoredRun:
        """`trainscale run ARGS`, once per pytest run (its --output and, with
        `weights`, --save-weights are the store's). `private_home`: HOME and
        TMPDIR in the run's folder, and a mark in its environment, to see what
        it leaves behind. `check`: fail unless it exited 0."""
        from runs import check_exit, check_may_train, trainscale

        check_may_train(f"trainscale run {' '.join(args[:2])}")
        described = json.dumps([args, weights, private_home], sort_keys=True)
        key = hashlib.sha256(described.encode()).hexdigest()[:16]
        with self._locked(key) as folder:
            result = folder / "result.json"
            if not result.exists():
                folder.mkdir(exist_ok=True)
                stored = StoredRun(list(args), 0, "", "", folder)
                command = [*args, "--output", str(stored.output)]
                if weights:
                    command += ["--save-weights", str(folder / "weights.npz")]
                env = None
                if private_home:
                    stored.home.mkdir()
                    stored.temp.mkdir()
                    env = {"HOME": str(stored.home), "TMPDIR": str(stored.temp), stored.mark: "1"}
                done = trainscale("run", *command, env=env, timeout=timeout)
                outcome = {"returncode": done.returncode, "stdout": done.stdout,
                           "stderr": done.stderr}  # fmt: skip
                result.write_text(json.dumps(outcome))
            outcome = json.loads(result.read_text())
        run = StoredRun(list(args), outcome["returncode"], outcome["stdout"], outcome["stderr"],
                        folder)  # fmt: skip
        if check:
            check_exit(["run", *args], run.returncode, run.stdout, run.stderr)
        return run


def store_root(tmp_path_factory) -> Path:
    """The folder every pytest-xdist worker of this pytest run shares."""
    base = Path(tmp_path_factory.getbasetemp())
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "run-store"
