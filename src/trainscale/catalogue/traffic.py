"""What one training step moves between replicas, for the step model
(trainscale.analysis.predict): a framework's registry entry names one of
these functions (FrameworkSpec.traffic), which reads a record's settings.

Imports neither TensorFlow nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from trainscale.catalogue.parameter_server_kind import PS_SERVERS


@dataclass(frozen=True)
class Traffic:
    """What one training step moves between replicas, for the step model
    (trainscale.analysis.predict): `passes` over the gradient's bytes, each pass moving
    (p-1)/p of them over every link of a ring of p replicas in p-1 steps (a
    ring all-reduce is 2 passes: a reduce-scatter and an all-gather), at
    `bytes_per_element` per trainable parameter. `refused`: why the model
    cannot say what this configuration moves (then no fit is made)."""

    passes: float = 2.0
    bytes_per_element: int = 4
    refused: str = ""
    # "ring": the passes go round a ring of the replicas; "parameter-server":
    # each of the workers sends and receives `passes` x the bytes through
    # `servers` servers' links.
    pattern: str = "ring"
    servers: int = 0


def all_reduce_traffic(compression_knob: str = "") -> Callable[[Mapping], Traffic]:
    """One all-reduce of the gradient, in half precision where `compression_knob` says fp16."""

    def traffic(settings: Mapping) -> Traffic:
        half = compression_knob and settings.get(compression_knob) == "fp16"
        return Traffic(2.0, 2 if half else 4)

    return traffic


def sharded_traffic(passes_on_nccl: float, who: str) -> Callable[[Mapping], Traffic]:
    """ZeRO / FSDP traffic on GPUs (NCCL), refused on CPU: gloo runs a
    reduce-scatter as a whole all-reduce (torch PR #118911), so the passes
    there are not the algorithm's."""

    def traffic(settings: Mapping) -> Traffic:
        if settings.get("device") == "cpu":
            return Traffic(refused=f"{who} on CPU: gloo's reduce-scatter is a full all-reduce")
        return Traffic(passes_on_nccl)

    return traffic


def no_traffic(settings: Mapping) -> Traffic:
    return Traffic(0.0)


def parameter_server_traffic(settings: Mapping) -> Traffic:
    # Every worker sends its gradient to the servers and reads the
    # parameters back: (workers / servers) x 2 x the model's bytes on each
    # server's link (trainscale.analysis.predict).
    servers = int(PS_SERVERS.value_in(settings))
    return Traffic(2.0, pattern="parameter-server", servers=servers)
