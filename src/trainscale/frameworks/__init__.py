"""Each ecosystem's code, in `tensorflow/` and `torch/`: its frameworks'
training code, its models, its GPT and its input pipeline. A framework's
registry entry (trainscale.catalogue.registry) names its Backend class as
"module:Class"; `backend_class` imports it, and only that ecosystem's
modules, when a run starts."""

from __future__ import annotations

import importlib

from trainscale.catalogue.registry import framework_spec


def backend_class(framework: str):
    """The framework's Backend (trainscale.harness.backend), where the registry says it is."""
    module, name = framework_spec(framework).backend.split(":")
    return getattr(importlib.import_module(module), name)
