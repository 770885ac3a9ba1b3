"""The high-level APIs' frameworks: Keras's fit and PyTorch Lightning's
Trainer, each training the model with the API's own loop in place of the
custom loop it replaces (FrameworkSpec.replaces: the refactoring analysis
puts the two side by side, seed 000's contrast). Their registry entries,
which trainscale.catalogue.registry appends after every custom loop's.

A Keras fit entry is derived from its loop's (launch, topology, knobs,
traffic): named LOOP-fit, its example the loop's with _fit. Imports neither
TensorFlow nor torch.
"""

from __future__ import annotations

from dataclasses import replace

from trainscale.catalogue.framework_spec import FrameworkSpec
from trainscale.catalogue.knobs import (
    HOROVOD_KNOBS,
    LIGHTNING_KNOBS,
    ddp_traffic,
    horovod_traffic,
    lightning_strategy_check,
)
from trainscale.catalogue.launch_kinds import HOROVOD, ONE_PROCESS, TORCHRUN
from trainscale.catalogue.traffic import no_traffic

# The Keras `fit` frameworks: the custom loop each replaces, and its Backend
# ("module:Class" below trainscale.frameworks.tensorflow).
_KERAS_FIT = {
    "tf-single": "keras_fit:SingleDeviceFitBackend",
    "horovod": "keras_fit:HorovodFitBackend",
    "tf-mirrored": "keras_fit:MirroredFitBackend",
    "tf-multiworker": "keras_fit:MultiWorkerFitBackend",
    "horovod-elastic": "horovod_elastic_fit:HorovodElasticFitBackend",
}


# What a fit entry has of its own, beyond its loop's.
_FIT_ADDS = {
    "horovod": {
        "concept_evidence": (
            ("gradient all-reduce", ("DistributedOptimizer",)),
            ("variable broadcast", ("BroadcastGlobalVariablesCallback",)),
            ("cross-replica reduction", ("MetricAverageCallback",)),
        )
    },
}


def fit_entries(registry: tuple[FrameworkSpec, ...]) -> tuple[FrameworkSpec, ...]:
    """Each framework of _KERAS_FIT trained by Keras's fit, as its own entry:
    the loop's launch, topology, knobs and traffic; named LOOP-fit, its
    example the loop's with _fit; the one-device one the others' base."""
    loops = {spec.name: spec for spec in registry}
    entries = []
    for loop, backend in _KERAS_FIT.items():
        spec = loops[loop]
        entries.append(
            replace(
                spec,
                name=f"{loop}-fit",
                label=f"{spec.label.replace(' (TensorFlow)', '')} (Keras fit)",
                backend=f"trainscale.frameworks.tensorflow.{backend}",
                example=spec.example.replace(".py", "_fit.py"),
                base="" if spec.one_device else "tf-single-fit",
                replaces=loop,
                **_FIT_ADDS.get(loop, {}),
            )
        )
    return tuple(entries)


LIGHTNING = (
    FrameworkSpec(
        "lightning-single",
        "PyTorch Lightning, 1 device",
        "torch",
        "torch_env",
        ONE_PROCESS,
        backend="trainscale.frameworks.torch.lightning:LightningSingle",
        requires="pytorch_lightning>=2",
        example="torch_lightning_single.py",
        one_node=True,
        one_device=True,
        replaces="torch-single",
        traffic=no_traffic,
    ),
    FrameworkSpec(
        "lightning",
        "PyTorch Lightning",
        "torch",
        "torch_env",
        TORCHRUN,
        backend="trainscale.frameworks.torch.lightning:LightningDistributed",
        requires="pytorch_lightning>=2",
        example="torch_lightning.py",
        base="lightning-single",
        replaces="torch-ddp",
        knobs=LIGHTNING_KNOBS,
        compared_with="horovod-fit",
        concept_evidence=(("training engine", ("Trainer",)),),
        traffic=ddp_traffic,
        check=lightning_strategy_check,
    ),
    # Seed 003's Pytorch_lightning_* rows: Lightning 1.9's strategy="horovod",
    # removed in Lightning 2.0, so it runs from an environment of its own
    # (make lightning1-env: .venv-torch's packages and Lightning 1.9.5).
    FrameworkSpec(
        "lightning-horovod",
        "PyTorch Lightning 1.9 (Horovod)",
        "torch",
        "lightning1_env",
        HOROVOD,
        backend="trainscale.frameworks.torch.lightning:LightningHorovod",
        requires="pytorch_lightning<2",
        example="torch_lightning_horovod.py",
        base="lightning-single",
        replaces="horovod-torch",
        knobs=HOROVOD_KNOBS,
        compared_with="horovod-fit",
        concept_evidence=(("training engine", ("Trainer",)),),
        traffic=horovod_traffic,
    ),
)


def high_level_entries(loops: tuple[FrameworkSpec, ...]) -> tuple[FrameworkSpec, ...]:
    """Lightning's entries, then Keras fit's (derived from `loops`)."""
    return LIGHTNING + fit_entries(loops)
