"""GPU utilisation and memory while a run trains (seed 003's table), from NVML.

A background thread reads NVML (the `nvidia-ml-py` package, NVIDIA's own
bindings; not the deprecated `pynvml` shim) every `interval` seconds during
the timed part, for the GPUs this process was given (CUDA_VISIBLE_DEVICES,
or every GPU when it is unset): the device's utilisation (percent of time a
kernel ran) and its memory in use (all processes', as `nvidia-smi` shows it,
beside the framework's own peak allocation in `peak_memory_bytes`). The
record gets mean and peak over the samples of every device of every process.
A CPU run samples nothing: its fields are null, and the tables say so.
"""

from __future__ import annotations

import os
import threading

import numpy as np


def visible_gpus() -> list[str] | None:
    """The GPUs CUDA_VISIBLE_DEVICES names (indices or UUIDs); None: all of them."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    return [d.strip() for d in visible.split(",") if d.strip()]


class GpuMonitor:
    """Samples `read()` -> [(utilisation %, memory bytes) per device] in a thread."""

    def __init__(self, read, interval: float = 0.1, source: str = ""):
        self.read, self.interval, self.source = read, interval, source
        self.samples: list[list[tuple[float, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-monitor", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.read())
            self._stop.wait(self.interval)

    def start(self) -> GpuMonitor:
        self._thread.start()
        return self

    def stop(self) -> dict | None:
        """Mean and peak over every sample of every device (None: no sample)."""
        self._stop.set()
        self._thread.join()
        values = np.array([pair for sample in self.samples for pair in sample], dtype=float)
        if not len(values):
            return None
        utilisation, memory = values[:, 0], values[:, 1]
        return {
            "utilisation_percent": {
                "mean": float(utilisation.mean()),
                "peak": float(utilisation.max()),
            },
            "memory_used_bytes": {"mean": float(memory.mean()), "peak": float(memory.max())},
            "samples": len(self.samples),
            "devices": len(self.samples[0]),
            "source": self.source,
        }


def nvml_monitor(interval: float = 0.1) -> GpuMonitor | str:
    """A monitor of this process's GPUs through NVML, or why there is none."""
    try:
        import pynvml  # the module nvidia-ml-py installs

        pynvml.nvmlInit()
    except Exception as err:  # not installed, or no driver: NVMLError_LibraryNotFound
        return f"NVML unavailable ({type(err).__name__}: {err})"
    names = visible_gpus()
    if names is None:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    else:
        handles = [
            pynvml.nvmlDeviceGetHandleByUUID(name)
            if name.startswith(("GPU-", "MIG-"))
            else pynvml.nvmlDeviceGetHandleByIndex(int(name))
            for name in names
        ]

    def read():
        return [
            (
                pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                pynvml.nvmlDeviceGetMemoryInfo(handle).used,
            )
            for handle in handles
        ]

    version = pynvml.nvmlSystemGetDriverVersion()
    return GpuMonitor(read, interval, f"NVML (nvidia-ml-py), driver {version}, every {interval} s")


def combine(summaries: list[dict | None]) -> dict | None:
    """Every process's summary -> the run's: sample-weighted mean, overall peak."""
    present = [s for s in summaries if isinstance(s, dict)]
    if not present:
        return None
    weights = np.array([s["samples"] * s["devices"] for s in present], dtype=float)

    def merged(key):
        means = np.array([s[key]["mean"] for s in present])
        return {
            "mean": float((means * weights).sum() / weights.sum()),
            "peak": max(s[key]["peak"] for s in present),
        }

    return {
        "utilisation_percent": merged("utilisation_percent"),
        "memory_used_bytes": merged("memory_used_bytes"),
        "samples": int(sum(s["samples"] for s in present)),
        "source": present[0]["source"],
    }
