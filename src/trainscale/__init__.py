"""trainscale: measure how distributed deep-learning training scales."""

__version__ = "0.1.0"
