"""The example scripts (examples/): where each framework's is, how a user
launches it, and running it here through the harness's own local launcher.

Each framework in the registry names its examples (FrameworkSpec.example,
for the study's image workload, and .text_example, for a GPT on text): a
complete training script written as that framework's documentation teaches,
which `trainscale refactoring` diffs against its ecosystem's single-device
example for the same workload. The examples import nothing of
trainscale, so a user can copy one and run it.

A one-process framework that drives several replicas (MirroredStrategy) has
only one CPU device to mirror on a machine without GPUs; its example takes
--cpu-replicas N, in a block marked as a CPU stand-in that the refactoring
analysis does not count (STAND_IN_BEGIN/END in trainscale.analysis.refactoring).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from trainscale.catalogue.launch_kinds import Plan
from trainscale.catalogue.registry import base_of, framework_spec

# The checkout the package runs from: examples/ sits beside src/.
# src/trainscale/launching/examples.py -> the checkout, four folders up.
REPOSITORY = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3))
EXAMPLES_DIR = os.path.join(REPOSITORY, "examples")

# What an example trains: its registry field and how the tables say it.
WORKLOADS = {
    "image": ("example", "VGG-16 on CIFAR-100"),
    "text": ("text_example", "GPT on text"),
}


@dataclass(frozen=True)
class Example:
    """`framework`'s example script for `workload`; it changes its base's,
    the single-device framework's example for the same workload."""

    framework: str
    workload: str = "image"

    @property
    def script(self) -> str:
        return getattr(framework_spec(self.framework), WORKLOADS[self.workload][0])

    @property
    def base(self) -> Example:
        return Example(base_of(self.framework), self.workload)

    @property
    def is_base(self) -> bool:
        return self.base == self

    @property
    def name(self) -> str:
        """The framework, and the workload unless it is images: a diff's file name."""
        return self.framework if self.workload == "image" else f"{self.framework}-{self.workload}"

    def path(self, examples_dir: str = EXAMPLES_DIR) -> str:
        return os.path.join(examples_dir, self.script)


def examples_of(framework: str) -> list[Example]:
    """The examples `framework` has, images first."""
    return [Example(framework, w) for w in WORKLOADS if Example(framework, w).script]


def example_path(framework: str, examples_dir: str = EXAMPLES_DIR) -> str:
    """`framework`'s first example (images where it has one)."""
    return examples_of(framework)[0].path(examples_dir)


def user_launch(example: Example) -> tuple[str, str]:
    """The commands that start the example on one node and on two (4 GPUs each),
    as its launch kind says ("" on two nodes for a framework of one node)."""
    spec = framework_spec(example.framework)
    one_node, two_nodes = spec.launch.user_commands(example.script)
    return one_node, "" if spec.one_node else two_nodes


def example_plan(
    example: Example,
    replicas: int,
    device: str,
    arguments: list[str],
    launch_settings,
    examples_dir: str = EXAMPLES_DIR,
) -> Plan:
    """The local processes that run `example` on `replicas` replicas, started
    as the harness starts its framework's ranks (its launch kind's local plan;
    `launch_settings` has the settings the launch kind reads)."""
    spec = framework_spec(example.framework)
    command = [sys.executable, example.path(examples_dir), *arguments]
    processes = spec.launch.processes_per_node(replicas, device)
    command += spec.launch.example_arguments(replicas, device)
    return spec.launch.local_plan(processes, command, launch_settings)
