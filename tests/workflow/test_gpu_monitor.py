"""The GPU monitor's sampling thread and how it sums up (trainscale.core.gpu_monitor).

The NVML side runs only where a GPU is (tests/harness/test_gpu_monitor.py
checks what it says here); what is computed from the samples is checked on
a reader that returns known values.
"""

import itertools
import threading
import time

import pytest

from trainscale.core.gpu_monitor import GpuMonitor, combine, visible_gpus


def test_samples_in_a_thread_until_stopped_and_sums_up_mean_and_peak():
    # Two devices: one at 10, 30, 10, 30 ... percent, the other always at 50.
    levels = itertools.cycle([10.0, 30.0])
    reads, enough, stopped = [], threading.Event(), threading.Event()

    def read():
        assert not stopped.is_set(), "sampled after stop()"
        reads.append(time.monotonic())
        if len(reads) >= 6:
            enough.set()
        return [(next(levels), 1e9), (50.0, 2e9)]

    # Each device's energy counter (millijoules): read at start() and at stop().
    counters = iter([{"gpu-a": 1000.0, "gpu-b": 5000.0}, {"gpu-a": 4000.0, "gpu-b": 5500.0}])
    monitor = GpuMonitor(read, interval=0.01, source="test", energy=lambda: next(counters))
    monitor.start()
    assert enough.wait(timeout=60)
    summary = monitor.stop()
    stopped.set()  # stop() joined the thread: a later sample would fail the read above
    count = len(reads)
    assert summary["samples"] == count >= 6 and summary["devices"] == 2
    assert summary["utilisation_percent"]["peak"] == 50.0
    expected = (sum(10.0 if i % 2 == 0 else 30.0 for i in range(count)) + 50.0 * count) / (
        2 * count
    )
    assert summary["utilisation_percent"]["mean"] == pytest.approx(expected)
    assert summary["memory_used_bytes"] == {"mean": 1.5e9, "peak": 2e9}
    assert summary["energy_joules_by_device"] == {"gpu-a": 3.0, "gpu-b": 0.5}
    assert summary["energy_joules"] == pytest.approx(3.5)


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
    assert run["energy_joules"] is None  # no counter read
    assert combine(["CPU run: no GPU to sample"]) is None


def test_a_device_two_processes_saw_draws_its_energy_once():
    # Both ranks of a node saw both GPUs (CUDA_VISIBLE_DEVICES unset) over the
    # same timed part: each device counts once, not once per rank.
    def seen(energy):
        return {"utilisation_percent": {"mean": 50.0, "peak": 50.0},
                "memory_used_bytes": {"mean": 1.0, "peak": 1.0}, "samples": 2, "devices": 2,
                "energy_joules_by_device": energy, "source": "s"}  # fmt: skip

    run = combine([seen({"gpu-a": 300.0, "gpu-b": 280.0}), seen({"gpu-a": 302.0, "gpu-b": 281.0})])
    assert run["energy_joules_by_device"] == {"gpu-a": 302.0, "gpu-b": 281.0}
    assert run["energy_joules"] == pytest.approx(583.0)


def test_the_gpus_a_process_was_given(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, GPU-8f1c")
    assert visible_gpus() == ["2", "GPU-8f1c"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpus() is None  # every GPU
