"""Python's cyclic garbage collector over a training process's start-up.

Importing TensorFlow or torch (and torch's DDP and optimizers import
torch._dynamo) creates millions of long-lived objects, and the collector
rescans the growing heap again and again while they are made: about a fifth
of a small run's CPU time per rank (bench/README.md, "The collector over
start-up"). So a `trainscale train` process starts with the collector off;
once its framework has built the model, everything alive is frozen (never
rescanned: gc.freeze) and collection resumes for the steps, which then
never pay for rescanning the libraries.

The start-up's own cyclic garbage is frozen with the rest, not collected
first: that one collection cost 0.24 (TensorFlow) to 0.36 (torch, with
torch._dynamo) CPU-seconds a process, for a few thousand objects and no
tensor (functions, cells, classes, Keras's symbolic graph; a few MB),
measured in torch-ddp, DeepSpeed ZeRO-3 and Horovod runs (bench/README.md).
"""

from __future__ import annotations

import gc


def pause_collection() -> None:
    """No cyclic collection until resume_collection (the start-up's imports)."""
    gc.disable()


def resume_collection() -> None:
    """The start-up's heap frozen, garbage and all, and collection on again;
    nothing where it is on already."""
    if gc.isenabled():
        return
    gc.freeze()
    gc.enable()
