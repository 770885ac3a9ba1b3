"""The example scripts (examples/): where each framework's is, how a user
launches it, and running it here through the harness's own local launcher.

Each framework in the registry names its example (FrameworkSpec.example): a
complete training script for the study's workload written as that
framework's documentation teaches, which `trainscale refactoring` diffs
against its ecosystem's single-device base. The examples import nothing of
trainscale, so a user can copy one and run it.

A one-process framework that drives several replicas (MirroredStrategy) has
only one CPU device to mirror on a machine without GPUs; its example takes
--cpu-replicas N, in a block marked as a CPU stand-in that the refactoring
analysis does not count (STAND_IN_BEGIN/END in trainscale.refactoring).
"""

from __future__ import annotations

import os
import sys

from trainscale.registry import REGISTRY, FrameworkSpec, framework_spec

# The checkout the package runs from: examples/ sits beside src/.
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES_DIR = os.path.join(REPOSITORY, "examples")

# What a user types to start an example, per registry launch kind: on one node
# of 4 GPUs, and on two such nodes ("" where the framework runs on one node).
_ONE_NODE = {
    "single": "python {script}",
    "horovod": "horovodrun -np 4 python {script}",
    "multiworker": "python {script}",
    "torch-distributed": "torchrun --nproc-per-node=4 {script}",
}
_TWO_NODES = {
    "horovod": "horovodrun -np 8 -H node1:4,node2:4 python {script}",
    "multiworker": (
        'TF_CONFIG=\'{{"cluster": {{"worker": ["node1:12345", "node2:12345"]}}, '
        '"task": {{"type": "worker", "index": I}}}}\' python {script}   # on node I+1'
    ),
    "torch-distributed": (
        "torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d "
        "--rdzv-endpoint=node1:29500 {script}   # on each node"
    ),
}


def example_path(framework: str, examples_dir: str = EXAMPLES_DIR) -> str:
    return os.path.join(examples_dir, framework_spec(framework).example)


def base_of(framework: str) -> str:
    """The single-device framework of `framework`'s ecosystem: what its example changes."""
    ecosystem = framework_spec(framework).ecosystem
    return next(s.name for s in REGISTRY if s.ecosystem == ecosystem and s.one_device)


def user_launch(spec: FrameworkSpec) -> tuple[str, str]:
    """The commands that start the example on one node and on two (4 GPUs each)."""
    script = spec.example
    one_node = _ONE_NODE[spec.launch].format(script=script)
    if spec.one_node:
        return one_node, ""
    return one_node, _TWO_NODES[spec.launch].format(script=script)


def example_plan(
    framework: str,
    replicas: int,
    device: str,
    arguments: list[str],
    horovod_launcher: str = "mpi",
    examples_dir: str = EXAMPLES_DIR,
) -> list[tuple[list[str], dict[str, str]]]:
    """The local processes that run `framework`'s example on `replicas` replicas,
    started as the harness starts that framework's ranks (launch.local_plan)."""
    from trainscale.launch import local_plan

    spec = framework_spec(framework)
    command = [sys.executable, example_path(framework, examples_dir), *arguments]
    processes = spec.processes_per_node(replicas, device)
    if device == "cpu" and processes == 1 and replicas > 1:
        command += ["--cpu-replicas", str(replicas)]
    return local_plan(spec.launch, processes, command, horovod_launcher)
