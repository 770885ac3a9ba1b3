"""A failure as an event of the study: the fault a grid point injects, the
timeline its processes write, and what is measured from that timeline.

A fault is one setting (`--fault`, a grid axis), the same for every
framework of a study:

    none                     no fault (the default)
    kill-rank1-step40        SIGKILL the process of rank 1 before timed step 40
    kill-node1-step40        SIGKILL every process of node 1, and its agent
                             where an elastic agent started them (torchrun's;
                             locally each of its agents is a node)
    stop-rank1-at20s-for10s  SIGSTOP rank 1 20 s into the timed steps, SIGCONT 10 s later

The process that is hit injects the fault itself, at the start of the step:
the kernel then does to it what it would do to a crashed or frozen process,
and the step it was at is known exactly. It fires once per grid point: the
timeline says it fired, and a restarted process (torchrun's, or the
workflow's next attempt) reads that.

The timeline is a JSON-lines file beside the record, appended to by every
process of every attempt (`trainscale run`'s first attempt starts it
afresh). Definitions (recovery_summary):
- detection: fault to the first sign a surviving process saw (a collective's
  error, its agent's SIGTERM, a restarted process);
- recovery: fault to the first step completed after the restart;
- steps redone: timed steps done before the fault, less those the restart
  restored (all of them for a framework that restarts from scratch);
- goodput: images of the timed blocks that count (each block once, the last
  time it was trained) / wall time from the first timed step to the last
  block's end, recovery included.

Pure Python: no TensorFlow, no torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

NO_FAULT = "none"
_FAULT = re.compile(
    r"^(?P<action>kill|stop)-(?P<target>rank|node)(?P<index>\d+)-"
    r"(?:step(?P<step>\d+)|at(?P<seconds>\d+(?:\.\d+)?)s)"
    r"(?:-for(?P<duration>\d+(?:\.\d+)?)s)?$"
)
FAULT_FORMS = "none, kill-rank1-step40, kill-node1-step40, stop-rank1-at20s-for10s"
# cluster.node_fault_command, in the job's environment where a node fault is
# due: how the cluster loses a node ({node}: SLURM's name of it).
NODE_FAULT_COMMAND = "TRAINSCALE_NODE_FAULT_COMMAND"


@dataclass(frozen=True)
class Fault:
    action: str  # kill or stop
    target: str  # rank (one process) or node (the process and its node's agent)
    index: int  # the rank (or the node) hit
    step: int | None  # before this timed step (counted from 0), or
    seconds: float | None  # this long after the first timed step began
    duration: float = 0.0  # how long a stopped process stays stopped


def parse_fault(text: str) -> Fault | None:
    """The fault `text` names (None for none); ValueError for any other text."""
    if text == NO_FAULT:
        return None
    found = _FAULT.match(text)
    if not found:
        raise ValueError(f"--fault {text!r} is not a fault; write one like {FAULT_FORMS}")
    parts = found.groupdict()
    if (parts["action"] == "stop") != (parts["duration"] is not None):
        raise ValueError(f"--fault {text!r}: a stop needs -forNs, and only a stop has one")
    return Fault(
        parts["action"],
        parts["target"],
        int(parts["index"]),
        int(parts["step"]) if parts["step"] is not None else None,
        float(parts["seconds"]) if parts["seconds"] is not None else None,
        float(parts["duration"] or 0),
    )


def check_fault(settings) -> str:
    """The setting's check: '' or the one-line message."""
    try:
        fault = parse_fault(settings.fault)
    except ValueError as err:
        return str(err)
    if fault and fault.target == "rank" and fault.index >= settings.replicas:
        return f"--fault {settings.fault}: the run has ranks 0 to {settings.replicas - 1}"
    # A node: every process of one node, with its launcher where an elastic
    # agent is one (locally torchrun-elastic starts an agent per replica).
    if fault and fault.target == "node" and fault.index >= max(settings.nodes, settings.replicas):
        return f"--fault {settings.fault}: the run has no node {fault.index}"
    return ""


def timeline_path(record_path: str) -> str:
    """The grid point's timeline, beside its record (what every attempt appends to)."""
    return record_path + ".timeline.jsonl"


def checkpoint_path(record_path: str) -> str:
    """Where an elastic framework keeps its training state between restarts."""
    return record_path + ".checkpoint"


def clear_side_files(record_path: str) -> None:
    """A grid point's first attempt starts with no timeline and no checkpoint."""
    for path in (timeline_path(record_path), checkpoint_path(record_path)):
        if os.path.exists(path):
            os.remove(path)


class Timeline:
    """One process's view of the grid point's timeline file."""

    def __init__(self, path: str, process: int = 0):
        self.path, self.process = path, process

    def write(self, event: str, at: float | None = None, **fields) -> None:
        """Append one event (a line under PIPE_BUF: appends from many processes
        stay whole); a run without a record (no --output) keeps no timeline."""
        if not self.path:
            return
        line = {"event": event, "time": time.time() if at is None else at}
        line.update(process=self.process, host=socket.gethostname(), pid=os.getpid(), **fields)
        with open(self.path, "a") as handle:
            handle.write(json.dumps(line) + "\n")

    def read(self) -> list[dict]:
        return read_timeline(self.path)

    def fault_fired(self) -> bool:
        return any(event["event"] == "fault_injected" for event in self.read())


def read_timeline(path: str) -> list[dict]:
    """The events in time order ([] where no timeline was written)."""
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        events = [json.loads(line) for line in handle if line.strip()]
    return sorted(events, key=lambda event: event["time"])


def inject(fault: Fault, timeline: Timeline, step: int, world_size: int) -> None:
    """Do `fault` to this process, noted first on the timeline."""
    timeline.write("fault_injected", step=step, world_size=world_size, fault=fault.__dict__)
    print(f"[trainscale] fault: {fault.action} {fault.target} at step {step}", file=sys.stderr)
    sys.stderr.flush()
    me = os.getpid()
    if fault.action == "stop":
        # The process cannot wake itself: a detached shell sends SIGCONT.
        wake = f"sleep {fault.duration}; kill -CONT {me}"
        subprocess.Popen(["sh", "-c", wake], start_new_session=True)
        os.kill(me, signal.SIGSTOP)
        timeline.write("fault_ended", step=step, world_size=world_size)
        return
    if fault.target == "node":
        lose_node()
    os.kill(me, signal.SIGKILL)


def lose_node() -> None:
    """The node this process runs on goes down: under SLURM, the cluster's
    node_fault_command (every process of the node dies, this one too); else
    torchrun's agent, the node's own launcher, where it started this process."""
    command, node = os.environ.get(NODE_FAULT_COMMAND), os.environ.get("SLURMD_NODENAME")
    if command and node:
        # Its own session: the command outlives this process, which it kills.
        # (Its output nowhere: the pipes this process writes to die with the node.)
        losing = subprocess.Popen(
            ["sh", "-c", command.replace("{node}", node)],
            # From where the job was submitted (the study's folder): a Ray
            # worker runs in a folder of Ray's.
            cwd=os.environ.get("SLURM_SUBMIT_DIR"),
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        with contextlib.suppress(subprocess.TimeoutExpired):
            losing.wait(timeout=60)  # (killed meanwhile, unless the command failed)
        state = f"exit {losing.returncode}" if losing.returncode is not None else "running"
        print(f"[trainscale] {command!r} left node {node} up ({state})", file=sys.stderr)
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        os.kill(os.getppid(), signal.SIGKILL)


class Injector:
    """Decides, step by step, whether this process is the one a fault hits now."""

    def __init__(self, fault: Fault | None, timeline: Timeline, rank: int, node: int, fired: bool):
        hit = fault and (fault.index == (rank if fault.target == "rank" else node))
        # A restarted process (an elastic restart, the workflow's next attempt)
        # finds the fault already `fired` on the timeline: it fires once.
        self.fault = fault if hit and not fired else None
        self.timeline, self.started = timeline, None

    def before_step(self, step: int, world_size: int) -> None:
        if self.fault is None:
            return
        self.started = self.started or time.monotonic()
        late = self.fault.seconds is not None and time.monotonic() - self.started >= (
            self.fault.seconds
        )
        if step == self.fault.step or late:
            fault, self.fault = self.fault, None
            inject(fault, self.timeline, step, world_size)


def _first(events: list[dict], names: tuple[str, ...], after: float) -> dict | None:
    return next((e for e in events if e["event"] in names and e["time"] > after), None)


def first_timed_step(events: list[dict]) -> float | None:
    """When the first timed step began: every wall time of the summary counts from it."""
    return next((e["time"] for e in events if e["event"] == "timed_start"), None)


def block_series(events: list[dict]) -> list[dict]:
    """Each timed block as the chief saw it end, in wall time from the first
    timed step: the timeline figure's points (a block redone appears twice)."""
    origin = first_timed_step(events)
    if origin is None:
        return []
    return [
        {
            "seconds": round(e["time"] - origin, 4),
            "block": e["block"],
            "images_per_sec": e["images"] / e["seconds"],
            "world_size": e["world_size"],
        }
        for e in events
        if e["event"] == "block_done"
    ]


def goodput(events: list[dict]) -> dict:
    """Images of the blocks that count over the wall time from the first timed
    step to the last block's end (recovery, checkpoints and restarts included)."""
    origin = first_timed_step(events)
    blocks = [e for e in events if e["event"] == "block_done"]
    if origin is None or not blocks:
        return {"goodput_images_per_sec": None, "wall_seconds": None}
    last_of_each = {e["block"]: e for e in blocks}  # in time order: the last one wins
    images = sum(e["images"] for e in last_of_each.values())
    wall = blocks[-1]["time"] - origin
    return {
        "goodput_images_per_sec": images / wall,
        "wall_seconds": wall,
        "images_counted": images,
        "images_trained": sum(e["images"] for e in blocks),
    }


def recovery_summary(events: list[dict]) -> dict:
    """What the timeline says a fault cost (see the module's definitions);
    without a fault, the goodput and the world size alone."""
    checkpoints = [e for e in events if e["event"] == "checkpoint"]
    summary = {
        **goodput(events),
        "world_sizes": _world_sizes(events),
        "checkpoints": len(checkpoints),
        "checkpoint_seconds": (
            sum(e["seconds"] for e in checkpoints) / len(checkpoints) if checkpoints else None
        ),
        # The wall time between checkpoints, restarts aside (Young's tau).
        "checkpoint_interval_seconds": _median_gap([e["time"] for e in checkpoints]),
    }
    fault = next((e for e in events if e["event"] == "fault_injected"), None)
    if fault is None:
        return {**summary, "fault_injected": False}
    at = fault["time"]
    origin = first_timed_step(events) or at
    seen = _first(events, ("detected", "start", "restored", "resumed"), at)
    restart = _first(events, ("start",), at) or _first(events, ("restored",), at)
    restored = _first(events, ("restored",), at)
    resumed = _first(events, ("resumed",), at)
    ended = _first(events, ("fault_ended",), at)  # a stopped process, woken
    return {
        **summary,
        "fault_injected": True,
        "fault_step": fault["step"],
        # Where the timeline figure marks them (from the first timed step).
        "fault_at_seconds": at - origin,
        "resumed_at_seconds": resumed["time"] - origin if resumed else None,
        "detection_seconds": seen["time"] - at if seen else None,
        "detected_by": (seen.get("how") or seen["event"]) if seen else None,
        "restart_seconds": restart["time"] - at if restart else None,
        "recovery_seconds": resumed["time"] - at if resumed else None,
        "steps_redone": fault["step"] - restored["step"] if restored else None,
        "world_size_before": fault["world_size"],
        "world_size_after": resumed["world_size"] if resumed else None,
        "stopped_seconds": ended["time"] - at if ended else None,
    }


def _world_sizes(events: list[dict]) -> list[dict]:
    """The world size over time: each change, from the chief's blocks."""
    changes: list[dict] = []
    for event in events:
        if event["event"] not in ("timed_start", "restored", "block_done"):
            continue
        if not changes or changes[-1]["world_size"] != event["world_size"]:
            changes.append({"time": event["time"], "world_size": event["world_size"]})
    return changes


def _median_gap(times: list[float]) -> float | None:
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    return gaps[len(gaps) // 2] if gaps else None
