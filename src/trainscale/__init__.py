"""trainscale: measure how distributed deep-learning training scales."""

__version__ = "0.1.0"

# The package's layers, bottom to top: a module may import its own layer and
# those below (tests/workflow/test_layers.py holds it; the docs' architecture
# page and reference/modules.md are made from it).
LAYERS = (
    "core",
    "catalogue",
    "harness",
    "frameworks",
    "launching",
    "study",
    "network",
    "analysis",
    "workflow",
    "cli",
)
