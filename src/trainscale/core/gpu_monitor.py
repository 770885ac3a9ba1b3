"""GPU utilisation and memory while a run trains (seed 003's table), from NVML.

A background thread reads NVML (the `nvidia-ml-py` package, NVIDIA's own
bindings; not the deprecated `pynvml` shim) every `interval` seconds during
the timed part, for the GPUs this process was given (CUDA_VISIBLE_DEVICES,
or every GPU when it is unset): the device's utilisation (percent of time a
kernel ran) and its memory in use (all processes', as `nvidia-smi` shows it,
beside the framework's own peak allocation in `peak_memory_bytes`). The
record gets mean and peak over the samples of every device of every process,
and the energy the devices drew over the timed part, from NVML's energy
counter (millijoules since the driver loaded; Volta and later), read at its
start and end, as Zeus measures a window and MLPerf Power a run: the record's
energy per image (or token), trainscale.core.timing.energy_per_example.
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
    """Samples `read()` -> [(utilisation %, memory bytes) per device] in a
    thread; `energy()` -> {device: millijoules} (a counter), or None where the
    devices have none, is read at start() and stop()."""

    def __init__(self, read, interval: float = 0.1, source: str = "", energy=None):
        self.read, self.interval, self.source, self.energy = read, interval, source, energy
        self.samples: list[list[tuple[float, float]]] = []
        self._energy_at_start: dict[str, float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-monitor", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.read())
            self._stop.wait(self.interval)

    def start(self) -> GpuMonitor:
        self._energy_at_start = self.energy() if self.energy else None
        self._thread.start()
        return self

    def stop(self) -> dict | None:
        """Mean and peak over every sample of every device, and the joules
        each device drew since start() (None: no sample)."""
        self._stop.set()
        self._thread.join()
        used = _energy_between(self._energy_at_start, self.energy() if self.energy else None)
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
            "energy_joules": sum(used.values()) if used else None,
            "energy_joules_by_device": used,
            "samples": len(self.samples),
            "devices": len(self.samples[0]),
            "source": self.source,
        }


def _energy_between(start: dict | None, end: dict | None) -> dict | None:
    """Joules per device between two readings of millijoule counters."""
    if not start or not end:
        return None
    return {device: (end[device] - start[device]) / 1000.0 for device in start if device in end}


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

    def energy():
        try:  # millijoules since the driver loaded; NotSupported before Volta
            return {
                _text(pynvml.nvmlDeviceGetUUID(h)): pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
                for h in handles
            }
        except pynvml.NVMLError:
            return None

    version = _text(pynvml.nvmlSystemGetDriverVersion())
    source = f"NVML (nvidia-ml-py), driver {version}, every {interval} s; energy counter"
    return GpuMonitor(read, interval, source, energy)


def _text(value) -> str:
    """NVML's strings: bytes in older bindings, str in newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


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

    # A device seen by several processes (every GPU of the node visible to
    # each rank) counts once: the processes read its counter over the same
    # timed part.
    energy: dict[str, float] = {}
    for summary in present:
        for device, joules in (summary.get("energy_joules_by_device") or {}).items():
            energy[device] = max(joules, energy.get(device, 0.0))
    return {
        "utilisation_percent": merged("utilisation_percent"),
        "memory_used_bytes": merged("memory_used_bytes"),
        "energy_joules": sum(energy.values()) if energy else None,
        "energy_joules_by_device": energy or None,
        "samples": int(sum(s["samples"] for s in present)),
        "source": present[0]["source"],
    }
