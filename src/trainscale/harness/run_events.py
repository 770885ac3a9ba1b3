"""What the timed loop tells the grid point's timeline, and what it does for
a fault (trainscale.core.faults): inject it where due, save and restore an
elastic framework's state, and note the events recovery is measured from.

The loop (trainscale.harness.training) calls these hooks; without --output
there is no timeline, and a framework that is not elastic never saves.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from trainscale.catalogue.elastic_kinds import AGENT_INDEX
from trainscale.core import faults
from trainscale.core.process_exit import remove_autograph_sources
from trainscale.harness.backend import Backend


class RunEvents:
    def __init__(self, backend: Backend, output: str | None, started: float):
        self.backend, s = backend, backend.settings
        topology = backend.topology
        self.timeline = faults.Timeline(faults.timeline_path(output) if output else "")
        self.timeline.process = topology.process_index
        self.chief = topology.is_chief
        self.elastic = backend.elastic and bool(output)
        self.checkpoint = faults.checkpoint_path(output) if output else ""
        self.fault = faults.parse_fault(s.fault)
        self.timeline.write("start", at=started, world_size=self.world_size)
        # A process started after the fault fired: a restart, or the next attempt.
        self.after_fault = self.timeline.fault_fired()
        # The node a node fault takes down: locally an elastic agent's (each
        # agent stands for a node), under SLURM the node's, else by rank.
        per_node = max(1, self.world_size // s.nodes)
        node = os.environ.get(AGENT_INDEX) or os.environ.get("SLURM_NODEID")
        node = int(node) if node else topology.process_index // per_node
        self.injector = faults.Injector(
            self.fault, self.timeline, topology.process_index, node, self.after_fault
        )
        self.resuming = self.after_fault
        backend.notice = self.notice
        # (Ray Train runs the loop in a thread of its worker: no handler there.)
        if self.fault and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._stopped)

    @property
    def world_size(self) -> int:
        return self.backend.topology.num_processes  # an elastic world changes

    def notice(self, event: str, **fields) -> None:
        """The backend's own events: a framework that recovers in its process
        (Horovod elastic) says when it restored; its next step ends recovery."""
        if event == "restored":
            self.resuming = True
            self.chief = self.backend.topology.is_chief
            self.timeline.process = self.backend.topology.process_index
        if self.chief or event == "detected":
            self.timeline.write(event, world_size=self.world_size, **fields)

    def _stopped(self, *_) -> None:
        # A survivor that its agent or launcher stops has been told of the failure.
        self.timeline.write("detected", how="SIGTERM", world_size=self.world_size)
        remove_autograph_sources()  # os._exit skips AutoGraph's own atexit hook
        sys.stderr.flush()
        os._exit(128 + signal.SIGTERM)

    def failed(self, error: BaseException) -> None:
        """A survivor's collective failing is its first sign of a lost peer."""
        if self.fault:
            how = f"{type(error).__name__}: {str(error).strip()[:120]}"
            self.timeline.write("detected", how=how, world_size=self.world_size)

    def restore(self) -> int:
        """The timed steps an elastic framework's saved state had done (0: none)."""
        steps = self.backend.restore_state(self.checkpoint) if self.elastic else 0
        if self.after_fault and self.chief:
            self.timeline.write("restored", step=steps, world_size=self.world_size)
        return steps

    @property
    def bounded_by_time(self) -> bool:
        """Whether the time budget may end the loop: not where a fault is (the
        work is fixed, so that the goodput of frameworks compares)."""
        return self.fault is None

    def before_step(self, step: int) -> None:
        self.injector.before_step(step, self.world_size)

    def after_step(self, loss, step: int) -> None:
        """The first step after a restart, waited for: recovery ends there."""
        if self.resuming:
            self.resuming = False
            self.backend.read_loss(loss)
            if self.chief:
                self.timeline.write("resumed", step=step, world_size=self.world_size)

    def timed_start(self, step: int) -> None:
        if self.chief:
            self.timeline.write("timed_start", step=step, world_size=self.world_size)

    def block_done(
        self, block: int, steps_done: int, images: int, seconds: float, **fields
    ) -> None:
        """Note the block (the chief), with `fields` (an epoch's curve point);
        save an elastic framework's state where due (every process: each has
        its random state to keep)."""
        if self.chief:
            self.timeline.write(
                "block_done",
                block=block,
                step=steps_done,
                images=images,
                seconds=seconds,
                world_size=self.world_size,
                **fields,
            )
        if self.elastic and (block + 1) % self.backend.settings.checkpoint_blocks == 0:
            clock = time.monotonic()
            self.backend.save_state(self.checkpoint, steps_done)
            if self.chief:
                seconds = time.monotonic() - clock
                self.timeline.write("checkpoint", step=steps_done, seconds=seconds)

    def curve_before(self, epoch: int) -> list[dict]:
        """Accuracy mode: the curve of the epochs before `epoch`, as the chief
        noted them (a restart's; the last time each epoch was trained)."""
        if not epoch:
            return []
        noted = {e["block"]: e["curve"] for e in self.timeline.read() if "curve" in e}
        return [noted[block] for block in range(epoch)]

    def seconds_since_timed_start(self) -> float:
        """Wall seconds since the grid point's first timed step (a restart's clock)."""
        started = faults.first_timed_step(self.timeline.read())
        return time.time() - started if started is not None else 0.0

    def summary(self) -> dict:
        """The record's `recovery` and `timeline` (the chief's, at the end)."""
        events = self.timeline.read()
        if self.fault and not any(e["event"] == "fault_injected" for e in events):
            # A node fault names a node no process of this run stands on.
            print(
                f"[trainscale] warning: --fault {self.backend.settings.fault} never "
                "fired: no process of this run is the one it names",
                file=sys.stderr,
            )
        if self.elastic and os.path.exists(self.checkpoint):
            os.remove(self.checkpoint)  # the run is whole: nothing to restart from
        return {
            "recovery": faults.recovery_summary(events),
            "timeline": faults.block_series(events),
        }
