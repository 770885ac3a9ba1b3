"""Python's cyclic garbage collector over a training process's start-up.

Importing TensorFlow or torch (and torch's DDP and optimizers import
torch._dynamo) creates millions of long-lived objects, and the collector
rescans the growing heap again and again while they are made: about a fifth
of a small run's CPU time per rank (bench/README.md, "The collector over
start-up"). So a `trainscale train` process starts with the collector off;
once its framework has built the model, one collection clears the start-up's
garbage, what is left is frozen (never rescanned: gc.freeze) and collection
resumes for the steps, which then never pay for rescanning the libraries.
"""

from __future__ import annotations

import gc


def pause_collection() -> None:
    """No cyclic collection until resume_collection (the start-up's imports)."""
    gc.disable()


def resume_collection() -> None:
    """The start-up's garbage collected once, the rest frozen, collection on
    again; nothing where it is on already."""
    if gc.isenabled():
        return
    gc.collect()
    gc.freeze()
    gc.enable()
