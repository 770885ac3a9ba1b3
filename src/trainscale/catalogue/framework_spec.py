"""The fields of a framework's registry entry (trainscale.catalogue.registry),
each with what it says and who reads it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from trainscale.catalogue.launch_kinds import LaunchKind
from trainscale.catalogue.traffic import Traffic, all_reduce_traffic
from trainscale.core.setting import Setting


@dataclass(frozen=True)
class FrameworkSpec:
    name: str
    label: str  # in tables and figures
    ecosystem: str  # whose training step runs it: "tensorflow" or "torch"
    environment: str  # the study config key naming the environment it runs from
    launch: LaunchKind
    # Where its training code is: "module:Class", a trainscale.harness.backend.Backend.
    backend: str
    # The module its processes cannot run without; `trainscale` refuses the
    # framework in a Python that lacks it (horovod-torch needs Horovod built
    # with its torch extension, which the TensorFlow environment never has).
    # "module<N" or "module>=N": a major version too (Lightning 1.9's
    # strategy="horovod" is gone from 2.x, which imports under the same name).
    requires: str
    # Its example script, below examples/: the study's image workload (VGG-16
    # on CIFAR-100) written as the framework's documentation teaches
    # (trainscale.launching.examples, .refactoring); "" for a framework that
    # splits a GPT only.
    example: str = ""
    # Its example on the text workload (a GPT on text), where it has one.
    text_example: str = ""
    one_node: bool = False
    one_device: bool = False
    # The single-device framework its example changes and its speed-up is
    # over: "" for its ecosystem's first (a high-level API's names its own).
    base: str = ""
    # The custom-loop framework a high-level API's (Keras fit) replaces: the
    # refactoring analysis puts the two side by side (seed 000's contrast).
    replaces: str = ""
    # The knobs only this framework reads (and the entries sharing the object).
    knobs: tuple[Setting, ...] = ()
    # The other ecosystem's framework it is held against in the tables
    # (trainscale.analysis.tables.cross_ecosystem_table), if any.
    compared_with: str = ""
    # Files beside the example a user writes too (DeepSpeed's JSON config):
    # counted as added lines by the refactoring analysis.
    example_files: tuple[str, ...] = ()
    # Evidence of the concepts its example teaches beyond the vocabulary's own
    # (trainscale.analysis.refactoring.CONCEPTS): (concept, names whose use shows it).
    concept_evidence: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # What one step moves between replicas (record settings -> Traffic).
    traffic: Callable[[Mapping], Traffic] = all_reduce_traffic()
    # A refusal of its own: settings -> "" or the one-line message.
    check: Callable[[Any], str] | None = None
    # "module:function" run by `trainscale train` in place of the training
    # function where the framework starts its workers itself (Ray Train's
    # driver, trainscale.frameworks.torch.ray_train.drive); "" for the others.
    driver: str = ""
    # Whether its replicas update the model each on its own, without waiting
    # for the others (a parameter server's workers): its label says so, and
    # its runs are not the same numbers twice.
    asynchronous: bool = False
    # Whether a lost process is survived: the run saves its training state
    # (ELASTIC_KNOBS) and goes on from it, on the processes left or restarted
    # (trainscale.core.faults measures what that costs).
    elastic: bool = False
    # Whether it splits one model over its ranks (pipeline stages, tensor-
    # parallel layers) instead of replicating it: it runs the text models
    # (trainscale.core.gpt) only.
    splits_model: bool = False

    def missing_module(self) -> str:
        """'' when this Python has what the framework requires, else what it lacks.

        Asked without importing anything heavy: a top-level module is looked
        up, not imported. A Horovod framework module (horovod.torch) is there
        only when Horovod was compiled for it: Horovod ships every framework's
        Python package but builds the library (mpi_lib*) of the ones it was
        built with.
        """
        import glob
        import importlib.util
        import os

        module, bound = _split_requirement(self.requires)
        top, _, framework = module.partition(".")
        spec = importlib.util.find_spec(top)
        # A folder of that name on sys.path with no __init__.py (the test
        # suite's tests/torch/) is a namespace package, not the framework.
        if spec is None or spec.origin is None:
            return self.requires
        if bound and not _major_within(top, bound):
            return f"{self.requires} (it has {top} {_version(top)})"
        if framework:
            folders = spec.submodule_search_locations or []
            if not any(glob.glob(os.path.join(f, framework, "mpi_lib*")) for f in folders):
                return f"{self.requires} (Horovod built without it)"
        return ""


def _split_requirement(requires: str) -> tuple[str, str]:
    """("module", "<2") from "module<2"; ("module", "") from "module"."""
    for operator in ("<", ">="):
        module, found, major = requires.partition(operator)
        if found:
            return module, operator + major
    return requires, ""


def _version(distribution: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _major_within(distribution: str, bound: str) -> bool:
    """Whether the installed distribution's major version meets "<N" or ">=N"."""
    major = _version(distribution).split(".")[0]
    if not major.isdigit():
        return False
    limit = int(bound.lstrip("<>="))
    return int(major) < limit if bound.startswith("<") else int(major) >= limit
