"""Every TensorFlow framework trains for real on the CPU with 2 replicas and
leaves an honest record: each framework's shared run (runs.framework_run),
whose weights test_equivalence.py holds to tf-single's."""

from __future__ import annotations

import socket

import pytest
from runs import GLOBAL_BATCH, framework_run

from trainscale.catalogue.launch_kinds import HOROVOD_LAUNCHER
from trainscale.catalogue.models import KNOWN_TRAINABLE_PARAMETERS
from trainscale.catalogue.registry import REGISTRY, framework_spec
from trainscale.catalogue.settings import RunSettings, reads_setting
from trainscale.frameworks.tensorflow.keras_models import forward_flops_per_image


def _cases():
    """(framework, replicas, horovod launcher, processes) for every TensorFlow
    framework of the registry: 2 replicas (1 for a one-device one), and the
    first framework of a launch kind that reads --horovod-launcher under each
    launcher (the launcher starts another's processes the same way)."""
    cases, launch_kinds = [], set()
    for spec in REGISTRY:
        if spec.ecosystem != "tensorflow":
            continue
        replicas = 1 if spec.one_device else 2
        # The processes that run the loop (a parameter server's chief only).
        settings = RunSettings(framework=spec.name, gpus_per_node=replicas, device="cpu")
        roles = spec.launch.roles(settings)
        processes = sum(role.count for role in roles if not role.runs)
        launchers = (None,)
        if reads_setting(spec.name, HOROVOD_LAUNCHER.name):
            every = spec.launch not in launch_kinds
            launchers = HOROVOD_LAUNCHER.choices if every else (HOROVOD_LAUNCHER.default,)
            launch_kinds.add(spec.launch)
        cases += [(spec.name, replicas, launcher, processes) for launcher in launchers]
    return cases


CASES = _cases()
IDS = [f"{c[0]}-{c[2]}" if c[2] else c[0] for c in CASES]


# The run under horovodrun's Gloo also turns tensor fusion off: fusion is a
# knob of Horovod's background loop, which both launchers share, so that one
# run proves both that Gloo's launch trains as mpirun's does and that fusion
# does not change the arithmetic (test_equivalence.KNOBS).
GLOO_RUN_KNOB = ("--horovod-fusion-threshold-mb", "0")


def launcher_options(launcher: str | None) -> tuple[str, ...]:
    """A Horovod framework's options for `launcher` (none for another framework)."""
    if not launcher:
        return ()
    return ("--horovod-launcher", launcher, *(GLOO_RUN_KNOB if launcher == "gloo" else ()))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("framework", "replicas", "launcher", "processes"),
    CASES,
    ids=IDS,
)
def test_framework_run_writes_an_ok_record(
    run_store, cifar_dir, framework, replicas, launcher, processes
):
    """Up to a minute for tf-ps in a loaded suite: the first test to ask for
    a framework's shared run trains it (run_store.py), and tf-ps starts four
    TensorFlow processes (chief, server, two workers); the other tests that
    read the same run find it done."""
    run = framework_run(run_store, cifar_dir, framework, replicas, *launcher_options(launcher))
    record = run.record
    assert record["schema"] == 1 and record["status"] == "ok"
    assert (record["framework"], record["replicas"], record["processes"]) == (
        framework,
        replicas,
        processes,
    )
    assert record["device"] == "cpu" and record["global_batch_size"] == GLOBAL_BATCH
    assert record["settings"]["horovod_launcher"] == (launcher or HOROVOD_LAUNCHER.default)
    # NVML samples GPUs only: on a CPU run the fields are null, and say why.
    assert record["gpu_utilisation"] is None and record["energy_per_image_joules"] is None
    assert record["gpu_monitor_note"] == "CPU run: no GPU to sample"
    assert (record["input_channels"], record["augmentation"]) == (3, "crop-and-flip")
    # Every process removed AutoGraph's sources from its temp folder, those
    # that end with os._exit too (trainscale.core.process_exit), and nothing
    # else is left there.
    assert run.left_in_temp() == []
    roles = framework_spec(framework).launch.roles(RunSettings(**record["settings"]))
    if len(roles) > 1:  # which process ran which role, in the record
        cluster = record["framework_config"]["cluster"]
        assert {name: len(tasks) for name, tasks in cluster.items()} == {
            role.name: role.count for role in roles
        }

    rate = record["images_per_sec"]
    assert len(rate["samples"]) == 2 and all(x > 0 for x in rate["samples"])
    assert rate["mean"] == pytest.approx(sum(rate["samples"]) / 2)
    # The total is the per-replica rate summed over replicas, not a copy of it.
    assert rate["mean"] == pytest.approx(record["per_replica_images_per_sec"]["mean"] * replicas)
    # Every image of the timed blocks (2 blocks of one step of the global batch).
    assert record["timed_images"] == pytest.approx(2 * GLOBAL_BATCH)

    provenance = record["provenance"]
    assert provenance["tensorflow"] == "2.15.1"
    assert provenance["horovod"] == "0.28.1"
    assert provenance["hosts"] == [socket.gethostname()] * processes
    assert [p["process"] for p in provenance["processes"]] == list(range(processes))
    devices = [d for p in provenance["processes"] for d in p["devices"]]
    assert len(devices) == replicas and all("CPU" in d for d in devices)
    assert record["peak_memory_bytes"] > 0
    assert record["startup_seconds"] > 0 and record["final_loss"] > 0
    # From process start (interpreter, imports, rendezvous) to the first timed step.
    assert record["seconds_to_first_timed_step"] > record["startup_seconds"]
    # From the launcher's start of the processes: their own start-up, and more,
    # to /proc's resolution (the process's age is read in 10 ms clock ticks).
    launched = record["seconds_from_launch_to_first_timed_step"]
    assert launched >= record["seconds_to_first_timed_step"] - 0.02
    # Achieved FLOP/s from the model's count; on a CPU no peak, so no MFU.
    flops = record["training_flops_per_image"]
    assert flops == 3 * forward_flops_per_image("lenet5", 32, 100)
    # What a gradient all-reduce moves (trainscale.analysis.predict reads it):
    # LeNet-5's, counted by hand (kernels and biases, 32x32x3 in, 100 classes).
    conv = (5 * 5 * 3 * 6 + 6) + (5 * 5 * 6 * 16 + 16)
    dense = (16 * 5 * 5 * 120 + 120) + (120 * 84 + 84) + (84 * 100 + 100)
    known = KNOWN_TRAINABLE_PARAMETERS[("lenet5", 32)]
    assert record["trainable_parameters"] == conv + dense == known
    assert record["achieved_tflops"] == pytest.approx(rate["mean"] * flops / 1e12)
    assert record["mfu"] is None and record["peak_basis"].startswith("unknown")
    assert record["peak_precision"] == "fp32"
    assert record["device_name"] and record["device_name"] != "unknown CPU"
    # Per-block progress lines reach stderr while it runs.
    assert "block 2/2" in run.stderr
    assert "images/sec total" in run.stdout
