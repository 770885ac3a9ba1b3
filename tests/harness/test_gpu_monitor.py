"""NVML through nvidia-ml-py, as the training environment has it: on a machine
with NVIDIA's driver it samples the GPUs; without, it says why, in one line."""

import time

from trainscale.core.gpu_monitor import GpuMonitor, nvml_monitor


def test_nvml_samples_the_gpus_or_says_why_it_cannot():
    monitor = nvml_monitor(interval=0.05)
    if isinstance(monitor, str):  # no driver here (a CPU machine)
        assert monitor.startswith("NVML unavailable (NVMLError_LibraryNotFound")
        return
    assert isinstance(monitor, GpuMonitor)
    monitor.start()
    time.sleep(0.3)
    summary = monitor.stop()
    assert summary["samples"] >= 2 and summary["devices"] >= 1
    assert 0 <= summary["utilisation_percent"]["mean"] <= 100
    assert summary["memory_used_bytes"]["peak"] > 0
