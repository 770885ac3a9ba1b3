"""The run's progress lines on stderr, the same in both modes (the chief's)."""

from __future__ import annotations

import sys


def log(message: str) -> None:
    print(f"[trainscale] {message}", file=sys.stderr, flush=True)


def who(settings) -> str:
    return f"{settings.framework} {settings.model} {settings.replicas} replica(s)"


def unit(settings) -> str:
    """What an example is, per second: an image, or a text model's sequence."""
    return f"seq/s ({settings.seq_len} tokens each)" if settings.is_text else "img/s"
