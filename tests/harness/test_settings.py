"""A run's settings: defaults, replicas and batches, the CLI round trip,
validation, and the launch plans (local and srun steps) they make."""

import dataclasses
import os

import pytest

from trainscale.catalogue.options import RunOptions
from trainscale.catalogue.settings import (
    RunSettings,
    SettingsError,
    validate,
    with_global_batch,
)


def test_defaults_follow_the_paper_but_the_images_stay_native():
    s = RunSettings(framework="horovod")
    assert (s.model, s.batch_size, s.optimizer, s.dataset) == ("vgg16", 64, "adam", "cifar100")
    # The paper resized CIFAR-100 to 224 and its study config says so; by
    # default a data set trains at its native side, which the settings name.
    assert s.image_size == 32
    assert RunSettings(framework="horovod", dataset="mnist").image_size == 28
    assert RunSettings(framework="horovod", dataset="mnist", image_size=64).image_size == 64
    assert RunSettings(framework="horovod", dataset="synthetic").image_size == 224


def test_replicas_and_global_batch():
    s = RunSettings(framework="horovod", nodes=3, gpus_per_node=4, batch_size=64)
    assert s.replicas == 12
    assert s.global_batch_size == 768


@pytest.mark.parametrize(
    ("framework", "device", "gpus", "expected"),
    [
        ("horovod", "gpu", 4, 4),
        ("horovod", "cpu", 2, 2),
        ("tf-multiworker", "gpu", 4, 1),  # one worker per node holding its GPUs
        ("tf-multiworker", "cpu", 2, 2),  # one worker per CPU replica
        ("tf-mirrored", "gpu", 4, 1),
        ("tf-single", "cpu", 1, 1),
        ("tf-ps", "cpu", 2, 4),  # a chief, a parameter server and a worker per replica
    ],
)
def test_processes_per_node(framework, device, gpus, expected):
    s = RunSettings(framework=framework, device=device, gpus_per_node=gpus)
    assert s.processes_per_node() == expected


def test_cli_args_round_trip():
    from trainscale.cli import parse

    s = RunSettings(
        framework="tf-multiworker",
        gpus_per_node=2,
        model="resnet50",
        batch_size=16,
        xla=True,
        augment=False,
        learning_rate=0.05,
        precision="bf16",
        collective_implementation="ring",
    )
    _, parsed, _ = parse(["train", *s.to_cli_args()])
    assert parsed == s
    # A setting its framework does not read is not passed: it stays at its default.
    horovod = dataclasses.replace(s, horovod_launcher="gloo")
    assert "--horovod-launcher" not in horovod.to_cli_args()
    assert parse(["train", *horovod.to_cli_args()])[1] == s
    assert "--horovod-launcher" in dataclasses.replace(horovod, framework="horovod").to_cli_args()


def test_settings_hash_ignores_data_location_only():
    a = RunSettings(framework="horovod", data_dir="/a")
    assert a.settings_hash() == dataclasses.replace(a, data_dir="/b").settings_hash()
    assert a.settings_hash() != dataclasses.replace(a, batch_size=32).settings_hash()


def test_global_batch_splits_or_is_refused():
    s = RunSettings(framework="horovod", gpus_per_node=3)
    assert with_global_batch(s, 96).batch_size == 32
    with pytest.raises(SettingsError, match="--global-batch-size 100 does not split over 3"):
        with_global_batch(s, 100)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"framework": "pytorch"}, "--framework 'pytorch' is unknown"),
        ({"model": "alexnet"}, "--model 'alexnet' is unknown; choose one of vgg16"),
        ({"batch_size": 0}, "--batch-size must be a positive integer, got 0"),
        ({"nodes": -1}, "--nodes must be a positive integer"),
        ({"image_size": 31}, "--image-size 31 is below vgg16's minimum of 32"),
        ({"model": "inception_v3", "image_size": 74}, "inception_v3's minimum of 75"),
        ({"framework": "tf-mirrored", "nodes": 2}, "tf-mirrored runs on one node"),
        ({"framework": "tf-single", "gpus_per_node": 2}, "tf-single runs on one device"),
        ({"warmup_steps": 0}, "--warmup-steps must be a positive integer, got 0"),
        ({"dataset": "cifar100", "data_dir": "/nonexistent"}, "--data-dir '/nonexistent'"),
    ],
)
def test_validation_names_the_option(changes, message):
    s = dataclasses.replace(RunSettings(framework="horovod", dataset="synthetic"), **changes)
    with pytest.raises(SettingsError) as info:
        validate(s)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_horovod_gloo_variables_from_slurm_task_variables():
    from trainscale.core.slurm import horovod_env_from_slurm

    task = {
        "SLURM_PROCID": "3",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURMD_NODENAME": "node2",
    }
    assert horovod_env_from_slurm(task) == {
        "HOROVOD_RANK": "3",
        "HOROVOD_SIZE": "4",
        "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_CROSS_RANK": "1",
        "HOROVOD_CROSS_SIZE": "2",
        "HOROVOD_HOSTNAME": "node2",
    }
    uneven = {**task, "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_NODEID": "1"}
    assert horovod_env_from_slurm(uneven)["HOROVOD_LOCAL_SIZE"] == "1"


def test_run_plans_srun_steps_inside_a_slurm_job(monkeypatch):
    from trainscale.launching.launch import process_plan

    monkeypatch.setenv("SLURM_JOB_ID", "42")
    s = RunSettings(framework="horovod", nodes=2, gpus_per_node=2, dataset="synthetic")
    options = RunOptions("r.json", requested_gpus_per_node=2, requested_cpus_per_task=3)
    [(argv, env, ends_by_itself, _)] = process_plan(s, options)
    # The job's CPUs per task asked for again: srun (SLURM >= 22.05) does
    # not inherit them, and without them a rank gets one CPU and no
    # SLURM_CPUS_PER_TASK to size its threads by.
    assert argv[:8] == [
        "srun",
        "--nodes=2",
        "--ntasks=4",
        "--ntasks-per-node=2",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        "--gres=gpu:2",
        "--cpus-per-task=3",
    ]
    assert "--mpi=pmix" in argv and argv[argv.index("--expect-cuda-devices") + 1] == "1"
    assert ends_by_itself
    # GPU ranks poll Open MPI's progress; CPU ranks yield a core they share.
    assert "OMPI_MCA_mpi_yield_when_idle" not in env
    on_cpu = dataclasses.replace(s, device="cpu")
    [(_, env, _, _)] = process_plan(on_cpu, options)
    assert env["OMPI_MCA_mpi_yield_when_idle"] == "1"
    mirrored = RunSettings(framework="tf-mirrored", gpus_per_node=4, dataset="synthetic")
    [(argv, _, _, _)] = process_plan(mirrored, RunOptions("r.json", requested_gpus_per_node=4))
    # One process is a step of its own too (SLURM then marks the step, not
    # the job, OUT_OF_MEMORY), holding all 4 GPUs.
    assert argv[:4] == ["srun", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1"]
    assert "--gres=gpu:4" in argv and not any(a.startswith("--cpus-per-task") for a in argv)
    assert argv[argv.index("--expect-cuda-devices") + 1] == "4"


def test_a_parameter_server_run_is_one_srun_step_of_roles_in_task_order(monkeypatch):
    from trainscale.catalogue.parameter_server_kind import SERVE
    from trainscale.launching.launch import process_plan, run_role

    monkeypatch.setenv("SLURM_JOB_ID", "42")
    s = RunSettings(framework="tf-ps", nodes=2, gpus_per_node=1, ps_servers=2, device="cpu")
    [(argv, env, _, _)] = process_plan(s, RunOptions("r.json"))
    # A chief, 2 servers, 2 workers: 5 tasks, node1 holding 3 (block order).
    assert argv[1:4] == ["--nodes=2", "--ntasks=5", "--ntasks-per-node=3"]
    assert "--distribution=block" in argv and env["GRPC_FAIL_FAST"] == "use_caller"
    runs = []
    for procid in range(5):
        monkeypatch.setenv("SLURM_PROCID", str(procid))
        runs.append(run_role(s))
    assert runs == ["", SERVE, SERVE, SERVE, SERVE]  # only the chief runs the loop
    monkeypatch.setenv("SLURM_PROCID", "5")
    with pytest.raises(IndexError):
        run_role(s)


def test_a_local_parameter_server_plan_ends_its_servers_when_the_chief_ends():
    import json

    from trainscale.launching.launch import rank_plan

    s = RunSettings(framework="tf-ps", gpus_per_node=2, device="cpu")
    plan = rank_plan(s, ["train"], 0)
    roles = [json.loads(p.env["TF_CONFIG"])["task"] for p in plan]
    assert roles == [
        {"type": "chief", "index": 0},
        {"type": "ps", "index": 0},
        {"type": "worker", "index": 0},
        {"type": "worker", "index": 1},
    ]
    assert [p.ends_by_itself for p in plan] == [True, False, False, False]
    assert [p.env["TRAINSCALE_PROCESS"] for p in plan] == ["0", "1", "2", "3"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1-02:03:04", 93784),
        ("02:03:04", 7384),
        ("03:04", 184),
        ("45", 45),
        ("UNLIMITED", None),
        ("", None),
    ],
)
def test_slurm_durations(text, seconds):
    from trainscale.core.slurm import parse_slurm_duration

    assert parse_slurm_duration(text) == seconds


def test_a_cpu_rank_takes_its_share_of_the_cores_and_no_more_than_slurm_granted(monkeypatch):
    from trainscale.core.cpus import cpu_share

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    assert [cpu_share(n) for n in (1, 2, 3, 16)] == [8, 4, 2, 1]
    # The SLURM lab's nodes share one machine's cores, unpinned: a task
    # granted one CPU runs one thread, not its node's whole share.
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert [cpu_share(n) for n in (1, 2)] == [1, 1]
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    assert [cpu_share(n) for n in (1, 2, 4)] == [3, 3, 2]


def test_the_former_block_flags_still_parse_and_are_not_shown():
    from trainscale.cli import build_parser, parse

    _, old, _ = parse(["train", "--framework", "horovod", "--iterations", "3",
                       "--steps-per-iteration", "4"])  # fmt: skip
    _, new, _ = parse(
        ["train", "--framework", "horovod", "--blocks", "3", "--steps-per-block", "4"]
    )
    assert old == new and (new.blocks, new.steps_per_block) == (3, 4)
    # Given neither, the declared defaults.
    _, default, _ = parse(["train", "--framework", "horovod"])
    assert (default.blocks, default.steps_per_block) == (10, 20)
    shown = build_parser()[1]["train"].format_help()
    assert "--blocks" in shown and "--iterations" not in shown


def test_run_plan_ends_the_processes_that_serve_once_the_others_have_ended():
    import sys
    import time

    from trainscale.catalogue.launch_kinds import Process
    from trainscale.launching.launch import run_plan

    python = sys.executable
    chief = Process([python, "-c", "import time; time.sleep(1)"], {})
    server = Process([python, "-c", "import time; time.sleep(600)"], {}, ends_by_itself=False)
    start = time.monotonic()
    result = run_plan([chief, server], timeout=60)
    assert result.code == 0 and not result.timed_out
    assert time.monotonic() - start < 20  # the server did not hold the run to its timeout
    # A server that fails ends the run, failed, though it never ends by itself.
    failing = Process([python, "-c", "raise SystemExit(7)"], {}, ends_by_itself=False)
    waiting = Process([python, "-c", "import time; time.sleep(600)"], {})
    assert run_plan([waiting, failing], timeout=60).code == 7


def test_a_process_the_run_does_not_need_may_fail_and_the_run_goes_on():
    import sys

    from trainscale.catalogue.launch_kinds import Process
    from trainscale.launching.launch import run_plan

    python = sys.executable
    # An elastic framework's second agent, lost: the first goes on and ends well.
    needed = Process([python, "-c", "import time; time.sleep(2)"], {})
    lost = Process([python, "-c", "raise SystemExit(9)"], {}, required=False)
    assert run_plan([needed, lost], timeout=60).code == 0
    # The one the run needs still fails it.
    assert run_plan([Process([python, "-c", "raise SystemExit(5)"], {}), lost], 60).code == 5


def test_a_server_waits_for_the_chief_to_start_and_returns_once_it_has_ended():
    import socket
    import threading
    import time

    from trainscale.frameworks.tensorflow.parameter_server import wait_for_chief
    from trainscale.harness.backend import DeviceError

    chief = socket.socket()
    chief.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{chief.getsockname()[1]}"

    def listen_a_while():
        time.sleep(1)  # a chief starts after its servers
        chief.listen()
        time.sleep(2)
        chief.close()

    threading.Thread(target=listen_a_while).start()
    start = time.monotonic()
    wait_for_chief(address, start_within=30)
    assert 2.5 < time.monotonic() - start < 10
    with pytest.raises(DeviceError, match="never started"):
        wait_for_chief(address, start_within=1)
