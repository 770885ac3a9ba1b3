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
analysis does not count (STAND_IN_BEGIN/END in trainscale.analysis.refactoring).
"""

from __future__ import annotations

import os
import sys

from trainscale.study.launch_kinds import Plan
from trainscale.study.registry import FrameworkSpec, framework_spec

# The checkout the package runs from: examples/ sits beside src/.
# src/trainscale/launching/examples.py -> the checkout, four folders up.
REPOSITORY = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3))
EXAMPLES_DIR = os.path.join(REPOSITORY, "examples")


def example_path(framework: str, examples_dir: str = EXAMPLES_DIR) -> str:
    return os.path.join(examples_dir, framework_spec(framework).example)


def user_launch(spec: FrameworkSpec) -> tuple[str, str]:
    """The commands that start the example on one node and on two (4 GPUs each),
    as its launch kind says ("" on two nodes for a framework of one node)."""
    one_node, two_nodes = spec.launch.user_commands(spec.example)
    return one_node, "" if spec.one_node else two_nodes


def example_plan(
    framework: str,
    replicas: int,
    device: str,
    arguments: list[str],
    launch_settings,
    examples_dir: str = EXAMPLES_DIR,
) -> Plan:
    """The local processes that run `framework`'s example on `replicas` replicas,
    started as the harness starts that framework's ranks (its launch kind's
    local plan; `launch_settings` has the settings the launch kind reads)."""
    spec = framework_spec(framework)
    command = [sys.executable, example_path(framework, examples_dir), *arguments]
    processes = spec.launch.processes_per_node(replicas, device)
    command += spec.launch.example_arguments(replicas, device)
    return spec.launch.local_plan(processes, command, launch_settings)
