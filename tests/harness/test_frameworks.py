"""Every framework trains for real on the CPU with 2 replicas and leaves an honest record."""

import socket

import pytest
from conftest import TINY, load_json, trainscale

from trainscale.harness.flops import KNOWN_TRAINABLE_PARAMETERS, forward_flops_per_image
from trainscale.study.launch_kinds import HOROVOD_LAUNCHER
from trainscale.study.registry import REGISTRY, framework_spec
from trainscale.study.settings import RunSettings, reads_setting


def _cases():
    """(framework, replicas, horovod launcher, processes) for every TensorFlow
    framework of the registry: 2 replicas (1 for a one-device one), and a
    framework that reads --horovod-launcher under each launcher."""
    cases = []
    for spec in REGISTRY:
        if spec.ecosystem != "tensorflow":
            continue
        replicas = 1 if spec.one_device else 2
        # The processes that run the loop (a parameter server's chief only).
        settings = RunSettings(framework=spec.name, gpus_per_node=replicas, device="cpu")
        roles = spec.launch.roles(settings)
        processes = sum(role.count for role in roles if not role.runs)
        launchers = (
            HOROVOD_LAUNCHER.choices
            if reads_setting(spec.name, HOROVOD_LAUNCHER.name)
            else ("mpi",)
        )
        cases += [(spec.name, replicas, launcher, processes) for launcher in launchers]
    return cases


CASES = _cases()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("framework", "replicas", "launcher", "processes"),
    CASES,
    ids=[f"{c[0]}-{c[2]}" if c[0] == "horovod" else c[0] for c in CASES],
)
def test_framework_run_writes_an_ok_record(
    tmp_path, cifar_dir, framework, replicas, launcher, processes
):
    output = tmp_path / "record.json"
    result = trainscale(
        "run",
        "--framework",
        framework,
        "--gpus-per-node",
        str(replicas),
        "--model",
        "small_cnn",
        "--batch-size",
        "16",
        "--dataset",
        "cifar100",
        "--data-dir",
        cifar_dir,
        "--horovod-launcher",
        launcher,
        *TINY,
        "--output",
        str(output),
        check=True,
    )
    record = load_json(output)
    assert record["schema"] == 1 and record["status"] == "ok"
    assert (record["framework"], record["replicas"], record["processes"]) == (
        framework,
        replicas,
        processes,
    )
    assert record["device"] == "cpu" and record["global_batch_size"] == 16 * replicas
    assert record["settings"]["horovod_launcher"] == launcher
    # NVML samples GPUs only: on a CPU run the fields are null, and say why.
    assert record["gpu_utilisation"] is None
    assert record["gpu_monitor_note"] == "CPU run: no GPU to sample"
    assert (record["input_channels"], record["augmentation"]) == (3, "crop-and-flip")
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
    assert flops == 3 * forward_flops_per_image("small_cnn", 32, 100)
    # What a gradient all-reduce moves (trainscale.analysis.predict reads it).
    assert record["trainable_parameters"] == KNOWN_TRAINABLE_PARAMETERS[("small_cnn", 32)]
    assert record["achieved_tflops"] == pytest.approx(rate["mean"] * flops / 1e12)
    assert record["mfu"] is None and record["peak_basis"].startswith("unknown")
    assert record["device_name"] and record["device_name"] != "unknown CPU"
    # Per-block progress lines reach stderr while it runs.
    assert "block 2/2" in result.stderr
    assert "images/sec total" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["horovod", "tf-multiworker"])
def test_a_time_budget_bounds_the_timed_blocks_on_every_process(tmp_path, framework):
    # Two processes must stop after the same block (else one waits forever in
    # the next block's collective); the record says how many fit.
    output = tmp_path / "record.json"
    result = trainscale(
        "run", "--framework", framework, "--gpus-per-node", "2", "--model", "small_cnn",
        "--dataset", "synthetic", *TINY, "--blocks", "100000", "--time-budget-seconds", "2",
        "--output", str(output), check=True,
    )  # fmt: skip
    record = load_json(output)
    blocks = record["blocks"]
    assert record["settings"]["time_budget_seconds"] == 2.0
    assert 2 <= blocks < 100000 and len(record["images_per_sec"]["samples"]) == blocks
    # The budget is counted on the slowest process; each step's all-reduce keeps
    # the processes in step, so the chief's own blocks took about as long.
    slowest_block = record["step_time_ms"]["p99"] * 2 / 1000  # 2 steps a block
    assert 1.5 <= record["timed_seconds"] <= 2.0 + 2 * slowest_block + 0.5
    assert f"block {blocks}/100000" in result.stderr
    assert f"block {blocks + 1}/100000" not in result.stderr
