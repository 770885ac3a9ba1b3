"""Bad options: exit code != 0, one line naming the option, no record written."""

import numpy as np
import pytest
from runs import trainscale


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--framework", "pytorch"], "--framework 'pytorch' is unknown"),
        (["--framework", "horovod", "--model", "alexnet"], "--model 'alexnet' is unknown"),
        (["--framework", "horovod", "--dataset", "imagenet"], "--dataset 'imagenet' is unknown"),
        (["--framework", "horovod", "--device", "tpu"], "--device 'tpu' is unknown"),
        (["--framework", "horovod", "--batch-size", "0"], "--batch-size must be a positive"),
        (["--framework", "horovod", "--batch-size", "-8"], "--batch-size must be a positive"),
        (["--framework", "horovod", "--gpus-per-node", "0"], "--gpus-per-node must be a positive"),
        (["--framework", "horovod", "--nodes", "-1"], "--nodes must be a positive"),
        (["--framework", "horovod", "--blocks", "0"], "--blocks must be a positive"),
        (["--framework", "horovod", "--steps-per-block", "0"], "--steps-per-block"),
        (["--framework", "horovod", "--image-size", "16"], "--image-size 16 is below vgg16's"),
        (
            ["--framework", "horovod", "--model", "inception_v3", "--image-size", "64"],
            "--image-size 64 is below inception_v3's minimum of 75",
        ),
        (
            ["--framework", "horovod", "--gpus-per-node", "3", "--global-batch-size", "64"],
            "--global-batch-size 64 does not split over 3 replicas",
        ),
        (["--framework", "horovod", "--batch-size", "x"], "argument --batch-size: invalid int"),
        (["--framework", "horovod", "--precision", "fp8"], "--precision 'fp8' is unknown"),
        (["--framework", "horovod", "--learning-rate", "0"], "--learning-rate must be positive"),
        (["--framework", "horovod", "--horovod-compression", "gzip"], "'gzip' is unknown"),
        (
            ["--framework", "horovod", "--horovod-fusion-threshold-mb", "-1"],
            "--horovod-fusion-threshold-mb must be zero or positive",
        ),
        (
            [
                "--framework",
                "tf-multiworker",
                "--device",
                "cpu",
                "--collective-implementation",
                "nccl",
            ],
            "--collective-implementation nccl needs --device gpu",
        ),
        (["--framework", "horovod", "--collective-timeout", "-5"], "--collective-timeout must"),
    ],
)
@pytest.mark.parametrize("command", ["train", "run"])
def test_bad_option_is_one_line_naming_it(tmp_path, command, args, expected):
    output = tmp_path / "record.json"
    dataset = [] if "--dataset" in args else ["--dataset", "synthetic"]
    result = trainscale(command, *args, *dataset, "--output", str(output), timeout=60)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert not output.exists()


def test_missing_data_dir(tmp_path):
    output = tmp_path / "record.json"
    result = trainscale(
        "train",
        "--framework",
        "tf-single",
        "--data-dir",
        str(tmp_path / "no"),
        "--output",
        str(output),
        timeout=60,
    )
    assert result.returncode == 2
    assert "--data-dir" in result.stderr and "holds no cifar100" in result.stderr
    assert not output.exists()


def test_a_bad_data_file_is_refused_in_one_line_before_any_process_starts(tmp_path):
    from trainscale.core.datasets import write_dataset

    images = np.zeros((8, 28, 28, 1), np.uint8)
    write_dataset("mnist", str(tmp_path), {"train": (images, np.arange(8))})
    labels = tmp_path / "train-labels-idx1-ubyte"
    labels.write_bytes(labels.read_bytes()[:-3])  # truncated
    output = tmp_path / "record.json"
    result = trainscale(
        "run",
        *("--framework", "horovod", "--gpus-per-node", "2", "--device", "cpu"),
        *("--model", "small_cnn", "--image-size", "28"),
        *("--dataset", "mnist", "--data-dir", str(tmp_path), "--output", str(output)),
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(labels) in lines[0] and "truncated" in lines[0], lines
    assert not output.exists()


def test_run_refuses_several_nodes_and_points_to_slurm(tmp_path):
    result = trainscale(
        "run",
        "--framework",
        "horovod",
        "--nodes",
        "2",
        "--dataset",
        "synthetic",
        "--output",
        str(tmp_path / "r.json"),
        timeout=60,
    )
    assert result.returncode == 2
    assert "--nodes 2" in result.stderr and "profiles/slurm" in result.stderr


def test_gpu_run_without_gpus_fails_before_any_record(tmp_path):
    # This machine has no GPU: asking for one must fail, never fall back to CPU.
    output = tmp_path / "r.json"
    result = trainscale(
        "run",
        "--framework",
        "tf-single",
        "--device",
        "gpu",
        "--model",
        "small_cnn",
        "--image-size",
        "32",
        "--dataset",
        "synthetic",
        "--output",
        str(output),
        env={"CUDA_VISIBLE_DEVICES": ""},
        timeout=120,
    )
    assert result.returncode != 0
    assert "needs 1 GPU(s) but this process sees 0" in result.stderr
    assert not output.exists()


def test_a_process_that_sees_fewer_gpus_than_its_job_asked_for_fails(tmp_path):
    # What catches a launcher that hides GPUs (e.g. a step wrapped in srun -n1).
    output = tmp_path / "r.json"
    result = trainscale(
        "train",
        "--framework",
        "tf-single",
        "--device",
        "cpu",
        "--model",
        "small_cnn",
        "--image-size",
        "32",
        "--dataset",
        "synthetic",
        "--expect-cuda-devices",
        "2",
        "--output",
        str(output),
        env={"CUDA_VISIBLE_DEVICES": "0"},
        timeout=120,
    )
    assert result.returncode == 1
    assert "given 2 GPU(s) per the job request but sees 1 (CUDA_VISIBLE_DEVICES=0)" in (
        result.stderr
    )
    assert not output.exists()


def test_horovodrun_passes_every_rank_command_through_whole(monkeypatch):
    # horovodrun --gloo parses the command it starts as well: a flag of ours
    # that abbreviates two of its options (--network for --network-interface
    # and --network-interfaces) stops it with "ambiguous option" (CI, once).
    # Every setting's flag, and the probe's rank command, through its parser.
    import sys

    import horovod.runner.launch as horovodrun

    from trainscale.catalogue.launch_kinds import horovod_command
    from trainscale.catalogue.settings import RunSettings

    train = [sys.executable, "-m", "trainscale", "train"]
    train += RunSettings(framework="horovod", network="eth", system="a").to_cli_args()
    train += ["--output", "record.json"]
    probe = [sys.executable, "-m", "trainscale.network.probe_ranks", "--transport", "horovod-gloo"]
    probe += ["--largest-message-bytes", "64", "--repetitions", "3", "--device", "cpu"]
    probe += ["--output", "probe.json"]
    for command in (train, probe):
        argv = horovod_command(2, "gloo", command)
        launcher = argv.index("trainscale.launching.horovodrun")
        monkeypatch.setattr(sys, "argv", ["horovodrun", *argv[launcher + 1 :]])
        assert horovodrun.parse_args().command == command


def test_a_rank_started_for_gloo_checks_that_horovod_has_it(monkeypatch):
    # The launcher no longer asks (launching.horovodrun): each rank does.
    import types

    import horovod.tensorflow as hvd

    from trainscale.core.horovod_ranks import require_gloo

    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1")
    require_gloo(hvd)  # this environment's Horovod was built with Gloo
    without = types.SimpleNamespace(__name__="horovod.torch", gloo_built=lambda: False)
    with pytest.raises(RuntimeError, match="horovod.torch was built without Gloo"):
        require_gloo(without)
    monkeypatch.delenv("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    require_gloo(without)  # started by mpirun: Gloo is not asked for


def test_mpirun_lets_cpu_ranks_yield_while_they_wait():
    # Busy polling takes a core from a CPU rank's own threads (bench/README.md);
    # a GPU rank's cores are free, and polling answers soonest.
    from trainscale.catalogue.launch_kinds import horovod_command

    yielding = ["--mca", "mpi_yield_when_idle", "1"]

    def yields(device: str) -> bool:
        argv = horovod_command(2, "mpi", ["python", "train.py"], device)
        return any(argv[i : i + 3] == yielding for i in range(len(argv)))

    assert yields("cpu") and not yields("gpu")


def test_mpirun_authenticates_its_local_ranks_without_munge(monkeypatch):
    # A munged that is not running cost every mpirun 2.3 s of PMIx retries
    # (launch_kinds.mpirun_env); a user's own choice of plugin stands.
    from trainscale.catalogue.launch_kinds import HorovodRanks
    from trainscale.catalogue.settings import RunSettings

    def mpirun_variables(launcher: str) -> dict:
        settings = RunSettings(framework="horovod", device="cpu", horovod_launcher=launcher)
        [process] = HorovodRanks().local_plan(2, ["python", "train.py"], settings)
        return process.env

    monkeypatch.delenv("PMIX_MCA_psec", raising=False)
    assert mpirun_variables("mpi") == {"PMIX_MCA_psec": "native"}
    assert mpirun_variables("gloo") == {}
    monkeypatch.setenv("PMIX_MCA_psec", "munge")
    assert mpirun_variables("mpi") == {}


def test_a_ray_example_starts_ray_as_lean_as_the_harness_does(monkeypatch):
    # An example's Ray instance started its idle task workers and metrics
    # exporters too (launch_kinds.LEAN_RAY): each costs CPU-seconds beside
    # the training; a user's own setting stands.
    from trainscale.catalogue.launch_kinds import LEAN_RAY, RayDriver
    from trainscale.catalogue.settings import RunSettings

    def ray_variables() -> dict:
        settings = RunSettings(framework="ray-train", device="cpu")
        [process] = RayDriver().local_plan(1, ["python", "torch_ray.py"], settings)
        return process.env

    for name in LEAN_RAY:
        monkeypatch.delenv(name, raising=False)
    assert ray_variables() == {**LEAN_RAY, "RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}
    monkeypatch.setenv("RAY_enable_worker_prestart", "1")
    assert ray_variables()["RAY_enable_worker_prestart"] == "1"
