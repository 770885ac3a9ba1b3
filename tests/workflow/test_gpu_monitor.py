"""The GPU monitor's sampling thread and how it sums up (trainscale.core.gpu_monitor).

The NVML side runs only where a GPU is (tests/harness/test_gpu_monitor.py
checks what it says here); what is computed from the samples is checked on
a reader that returns known values.
"""

import itertools
import time

import pytest

from trainscale.core.gpu_monitor import GpuMonitor, combine, visible_gpus


def test_samples_in_a_thread_until_stopped_and_sums_up_mean_and_peak():
    # Two devices: one at 10, 30, 10, 30 ... percent, the other always at 50.
    levels = itertools.cycle([10.0, 30.0])
    reads = []

    def read():
        reads.append(time.monotonic())
        return [(next(levels), 1e9), (50.0, 2e9)]

    monitor = GpuMonitor(read, interval=0.01, source="test").start()
    time.sleep(0.2)
    summary = monitor.stop()
    count = len(reads)
    time.sleep(0.05)
    assert len(reads) == count >= 5  # stopped: no sample after stop()
    assert summary["samples"] == count and summary["devices"] == 2
    assert summary["utilisation_percent"]["peak"] == 50.0
    expected = (sum(10.0 if i % 2 == 0 else 30.0 for i in range(count)) + 50.0 * count) / (
        2 * count
    )
    assert summary["utilisation_percent"]["mean"] == pytest.approx(expected)
    assert summary["memory_used_bytes"] == {"mean": 1.5e9, "peak": 2e9}


def test_processes_combine_weighted_by_their_samples():
    one = {"utilisation_percent": {"mean": 20.0, "peak": 40.0},
           "memory_used_bytes": {"mean": 1.0, "peak": 3.0}, "samples": 3, "devices": 1,
           "source": "s"}  # fmt: skip
    other = {"utilisation_percent": {"mean": 60.0, "peak": 90.0},
             "memory_used_bytes": {"mean": 5.0, "peak": 7.0}, "samples": 1, "devices": 1,
             "source": "s"}  # fmt: skip
    run = combine([one, other, "CPU run: no GPU to sample", None])
    assert run["utilisation_percent"] == {"mean": 30.0, "peak": 90.0}
    assert run["memory_used_bytes"] == {"mean": 2.0, "peak": 7.0} and run["samples"] == 4
    assert combine(["CPU run: no GPU to sample"]) is None


def test_the_gpus_a_process_was_given(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, GPU-8f1c")
    assert visible_gpus() == ["2", "GPU-8f1c"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpus() is None  # every GPU
