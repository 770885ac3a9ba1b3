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
    deadline = time.monotonic() + 60
    while len(monitor.samples) < 2:  # the sampling thread's own pace
        assert time.monotonic() < deadline, "NVML gave no second sample in 60 s"
        time.sleep(0.01)
    summary = monitor.stop()
    assert summary["samples"] >= 2 and summary["devices"] >= 1
    assert 0 <= summary["utilisation_percent"]["mean"] <= 100
    assert summary["memory_used_bytes"]["peak"] > 0
    # Volta and later count the energy drawn; older GPUs say nothing.
    assert summary["energy_joules"] is None or summary["energy_joules"] >= 0
