"""Running the real `trainscale` command from tests, in whichever environment
runs them (.venv-train for tests/harness, .venv-torch for tests/torch)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The interpreter running the tests is the training environment's (make test
# uses .venv-train/bin/python), so `-m trainscale` is the installed harness.
TRAINSCALE = [sys.executable, "-m", "trainscale"]

# Tiny but real: every run below trains for real on the CPU.
TINY = [
    "--device",
    "cpu",
    "--image-size",
    "32",
    "--warmup-steps",
    "1",
    "--blocks",
    "2",
    "--steps-per-block",
    "2",
]


def show_in_the_log(record_property, text: str) -> None:
    """`text` printed at the end of the suite's log, whether the test passes or
    not, also from a pytest-xdist worker (whose own output nobody sees): the
    suite's conftest prints every test's "shown" property (print_shown)."""
    record_property("shown", text)


def print_shown(terminalreporter) -> None:
    """pytest_terminal_summary: what the tests asked to show (show_in_the_log)."""
    for outcome in ("passed", "failed"):
        for report in terminalreporter.stats.get(outcome, []):
            for name, text in getattr(report, "user_properties", ()):
                if name == "shown":
                    terminalreporter.write_line(f"\n--- {report.nodeid}\n{text}")


def check_may_train(what: str) -> None:
    """A test not marked `slow` trains nothing (tests/conftest.py; make test-fast)."""
    if os.environ.get("TRAINSCALE_TEST_MAY_TRAIN") == "0":
        raise AssertionError(f"{what} trains a model: mark the test `slow`")


def trainscale(*args: str, timeout: float = 300, check: bool = False, env=None):
    """Run the CLI; return the CompletedProcess (stdout and stderr as text). A
    `run` or `example` that ran to its end trained: only a `slow` test may."""
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    result = subprocess.run(
        [*TRAINSCALE, *args], capture_output=True, text=True, timeout=timeout, env=full_env
    )
    if args and args[0] in ("run", "example") and result.returncode == 0:
        check_may_train(f"trainscale {' '.join(args[:3])}")
    if check:
        check_exit(args, result.returncode, result.stdout, result.stderr)
    return result


def check_exit(args, returncode: int, stdout: str, stderr: str) -> None:
    """Fail, with what it printed, unless `trainscale ARGS` exited 0."""
    if returncode != 0:
        raise AssertionError(
            f"trainscale {' '.join(args)} exited {returncode}\n"
            f"stdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-4000:]}"
        )


def load_json(path) -> dict:
    with open(path) as handle:
        return json.load(handle)


def make_cifar_dir(root) -> str:
    """A small data set in the real cifar-100-python format (the folder form)."""
    from trainscale.core.datasets import generate_cifar100

    generate_cifar100(str(root), num_images=256, seed=7)
    return str(root)


def make_mnist_dir(root, train: int, test: int, seed: int) -> str:
    """Random images and labels in MNIST's real IDX format, both splits."""
    import numpy as np

    from trainscale.core.datasets import write_dataset

    rng = np.random.default_rng(seed)
    splits = {
        split: (rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8), rng.integers(0, 10, n))
        for split, n in (("train", train), ("test", test))
    }
    write_dataset("mnist", str(root), splits)
    return str(root)


# The one run of each framework that its record checks, its equivalence to
# its one-device run and the examples' comparison all read (run_store.py):
# LeNet-5 at 32x32, which has neither dropout nor batch normalisation, so the
# only difference 2 replicas may show against one device on the same global
# batch is float32's summation order (and which trains in a fraction of
# VGG-16's time: these runs are many); plain SGD, whose update is linear in
# the gradient (Adam's first step is lr * sign(g), which would hide a wrong
# scale); one warm-up step and two timed blocks of one step.
GLOBAL_BATCH = 8
SHARED_SHAPE = [
    "--model", "lenet5", "--image-size", "32", "--device", "cpu",
    "--global-batch-size", str(GLOBAL_BATCH), "--optimizer", "sgd", "--learning-rate", "0.05",
    "--warmup-steps", "1", "--blocks", "2", "--steps-per-block", "1",
]  # fmt: skip


# A GPT's shared runs (tests/torch/test_gpt_equivalence.py): gpt-tiny on
# synthetic tokens (drawn by their place in the global batch, so the same
# however the batch is split), global batch 8, SGD, 2 steps.
GPT_SHAPE = [
    "--model", "gpt-tiny", "--dataset", "synthetic", "--seq-len", "16", "--vocab-size", "96",
    "--device", "cpu", "--global-batch-size", str(GLOBAL_BATCH),
    "--optimizer", "sgd", "--learning-rate", "0.5",
    "--warmup-steps", "1", "--blocks", "1", "--steps-per-block", "1",
]  # fmt: skip


def gpt_run(run_store, framework: str, replicas: int, *options: str):
    """`framework`'s shared GPT run (GPT_SHAPE), its weights saved: the GPT
    equivalence tests' runs, which the text examples' losses are held to. A
    torch framework's profiles its tensor memory after the timed step
    (--tensor-memory; tests/torch/test_memory_model.py reads it)."""
    from trainscale.catalogue.registry import framework_spec

    if framework_spec(framework).ecosystem == "torch":
        options = ("--tensor-memory", *options)
    args = ("--framework", framework, "--gpus-per-node", str(replicas), *GPT_SHAPE, *options)
    return run_store.run(*args, weights=True)


def framework_run(run_store, cifar_dir: str, framework: str, replicas: int, *options: str):
    """`framework`'s shared run on `replicas` CPU replicas (SHARED_SHAPE) on
    the CIFAR-100-format data, with `options`; its weights saved. A Horovod
    framework names its launcher (mpirun unless `options` say otherwise), so
    the same run has one key whoever asks. Each runs with a HOME and TMPDIR
    of its own, to see what it leaves there (StoredRun.left_in_temp)."""
    from trainscale.catalogue.launch_kinds import HOROVOD_LAUNCHER
    from trainscale.catalogue.settings import reads_setting

    if reads_setting(framework, HOROVOD_LAUNCHER.name) and "--horovod-launcher" not in options:
        options = ("--horovod-launcher", HOROVOD_LAUNCHER.default, *options)
    return run_store.run(
        *("--framework", framework, "--gpus-per-node", str(replicas), *SHARED_SHAPE),
        *("--data-dir", cifar_dir, *options),
        weights=True,
        private_home=True,
    )


def largest_difference(weights, others) -> float:
    """max |a - b| over two lists of weight arrays of the same shapes."""
    import numpy as np

    return max(float(np.max(np.abs(a - b))) for a, b in zip(weights, others, strict=True))


def assert_options_recorded(settings: dict, options: list[str]) -> None:
    """Each `--flag value` pair, `--flag` and `--no-flag` of `options` is in a record's settings."""
    options = list(options)
    while options:
        flag = options.pop(0)
        if flag.startswith("--no-"):
            assert settings[flag[5:].replace("-", "_")] is False, flag
            continue
        key = flag[2:].replace("-", "_")
        if not options or options[0].startswith("--"):
            assert settings[key] is True, flag
            continue
        value = options.pop(0)
        assert str(settings[key]) == value or float(settings[key]) == float(value), key


def assert_trains_like_one_device(reference, run, atol: float, label: str) -> None:
    """`run`'s (initial, final) weights start as `reference`'s exactly and end within atol."""
    import numpy as np

    (single_initial, single_final), (initial, final) = reference, run
    for a, b in zip(single_initial, initial, strict=True):
        np.testing.assert_array_equal(a, b)  # same start, or the test proves nothing
    moved = largest_difference(single_final, single_initial)
    assert moved > 100 * atol, f"training barely moved the weights ({moved}); test too weak"
    difference = largest_difference(single_final, final)
    print(f"{label}: max |w - w_single| = {difference:.3e} (weights moved {moved:.3e})")
    assert difference <= atol


def assert_knob_effect(single_final, final, atol: float, changes_numbers: bool, label: str):
    """A knob that changes the arithmetic moves the weights a little; others not at all."""
    largest = largest_difference(single_final, final)
    print(f"{label}: max |dw| {largest:.2e}")
    if changes_numbers:
        assert atol < largest < 1e-3
    else:
        assert largest < atol


def assert_horovod_elastic_went_on_alone(record: dict) -> None:
    """A 2-rank Horovod elastic run of 6 blocks of 5 steps of 8 images, a commit
    after each, rank 1 killed before step 12: the survivor caught Horovod's
    error, restored the commit of step 10 in its own process (nothing
    restarted) and trained alone, its host's other name blacklisted."""
    recovery = record["recovery"]
    print({k: v for k, v in recovery.items() if k != "world_sizes"})
    assert recovery["detected_by"] == "HorovodInternalError"
    assert recovery["steps_redone"] == 2
    assert (recovery["world_size_before"], recovery["world_size_after"]) == (2, 1)
    assert record["replicas"] == record["processes"] == 1
    assert recovery["images_counted"] == (2 * 2 + 4 * 1) * 5 * 8
    assert 0 < recovery["detection_seconds"] < recovery["recovery_seconds"] < 120


def one_per_launch_kind(ecosystem: str) -> list[str]:
    """The first framework of `ecosystem` for each launch kind (trainscale.catalogue.launch_kinds):
    where a failure's handling is the launcher's, more of a kind prove nothing new.
    A kind is its class: torchrun's and DeepSpeed's differ only in the commands
    a user is shown, and start the same processes."""
    from trainscale.catalogue.registry import REGISTRY

    first = {}
    for spec in REGISTRY:
        if spec.ecosystem == ecosystem:
            first.setdefault(type(spec.launch), spec.name)
    return list(first.values())


def check_a_torch_run(record, stdout: str, replicas: int):
    """What every torch framework's run of an image model records
    (tests/torch: test_frameworks.py, and test_ray_train.py for Ray's)."""
    import pytest

    from trainscale.catalogue.models import KNOWN_TRAINABLE_PARAMETERS

    assert record["status"] == "ok" and record["source"] == "measured"
    assert record["replicas"] == record["processes"] == replicas
    assert len(record["provenance"]["processes"]) == replicas
    assert sorted(p["process"] for p in record["provenance"]["processes"]) == list(range(replicas))
    assert record["provenance"]["torch"].startswith("2.13.0")
    assert "tensorflow" not in record["provenance"]
    # The total is the sum of every process's rate, each timed on its own blocks.
    rate = record["images_per_sec"]["mean"]
    assert rate == pytest.approx(record["per_replica_images_per_sec"]["mean"] * replicas)
    # Every image of the timed blocks, once: each process's rate times its own seconds.
    steps = record["blocks"] * record["settings"]["steps_per_block"]
    assert record["timed_images"] == pytest.approx(steps * record["global_batch_size"])
    assert record["training_flops_per_image"] > 0 and record["final_loss"] > 0
    # Keras's count: the torch model is its twin (trainscale.analysis.predict reads it).
    model = (record["model"], record["image_size"])
    assert record["trainable_parameters"] == KNOWN_TRAINABLE_PARAMETERS[model]
    # The collectives of one untimed step, as torch's profiler saw them: every
    # framework over torch.distributed moves the gradient somehow (DDP in one
    # all-reduce, FSDP2 and ZeRO in their own; Horovod's own thread is not
    # torch.distributed's).
    from trainscale.frameworks import backend_class
    from trainscale.frameworks.torch.torch_distributed import TorchDistributed

    if replicas > 1 and issubclass(backend_class(record["framework"]), TorchDistributed):
        collectives = record["collectives_per_step"]
        assert all(name.split(":")[0] == "gloo" for name in collectives), collectives
        assert sum(c["elements"] for c in collectives.values()) >= record["trainable_parameters"]
    assert "images/sec total" in stdout


def _write_python_docs_wikitext_2(folder: Path) -> str:
    """A small WikiText-2 release in `folder`: 12 of Python's reference topics
    to train on, 2 held out."""
    from trainscale.core.datasets import DATASETS
    from trainscale.core.text_data import python_docs_articles

    text = [f" = {title} = \n\n{body}\n" for title, body in python_docs_articles()]
    splits = {"train": "".join(text[:12]), "valid": "".join(text[40:42])}
    DATASETS["wikitext-2"].release.write(str(folder), splits)
    return str(folder)


def assert_trains_to_a_perplexity(tmp_path: Path, framework: str, target: float) -> None:
    """`framework` on 2 replicas trains gpt-tiny in accuracy mode on held-out
    Python reference text: its perplexity fell each epoch and it stopped at
    the first epoch at or below `target`, before the last of 4."""
    import pytest

    output, seq_len, epochs = tmp_path / "run.json", 32, 4
    trainscale(
        "run",
        *("--framework", framework, "--gpus-per-node", "2", "--device", "cpu"),
        *("--model", "gpt-tiny", "--seq-len", str(seq_len), "--batch-size", "8"),
        *("--dataset", "wikitext-2", "--data-dir", _write_python_docs_wikitext_2(tmp_path)),
        *("--mode", "accuracy", "--epochs", str(epochs), "--target-perplexity", str(target)),
        *("--output", str(output)),
        check=True,
        timeout=600,
    )
    record = load_json(output)
    curve = record["curve"]
    print([round(point["test_perplexity"], 3) for point in curve])
    assert record["target_metric"] == "test_perplexity" and record["target"] == target
    # Byte tokens start near-uniform (256); English bytes are far from it.
    assert curve[0]["test_perplexity"] < 40
    assert all(a["test_perplexity"] > b["test_perplexity"] for a, b in zip(curve, curve[1:]))
    for point in curve:
        assert point["test_perplexity"] == pytest.approx(math.exp(point["test_loss"]))
    assert record["epochs_run"] == record["epochs_to_target"] < epochs
    assert curve[-1]["test_perplexity"] <= target < curve[-2]["test_perplexity"]
    tokens = seq_len * record["images_per_sec"]["mean"]
    assert record["tokens_per_sec"]["mean"] == pytest.approx(tokens)


def assert_classifies_the_sky_survey(tmp_path: Path, framework: str) -> dict:
    """`framework` on 2 replicas trains the mlp in accuracy mode on a small
    SDSS DR17 table (trainscale.core.sdss.write_sdss's 600 rows) to 90 % test
    accuracy: the table's 8 features arrive as a 1x1 input, sharded over the
    replicas, and its three classes are told apart."""
    from trainscale.core.sdss import write_sdss

    output = tmp_path / "run.json"
    trainscale(
        "run",
        *("--framework", framework, "--gpus-per-node", "2", "--device", "cpu"),
        *("--model", "mlp", "--batch-size", "16", "--optimizer", "adam"),
        *("--dataset", "sdss17", "--data-dir", write_sdss(str(tmp_path / "sdss"), 600, seed=4)),
        *("--mode", "accuracy", "--epochs", "40", "--target-accuracy", "0.9"),
        *("--learning-rate", "0.003", "--output", str(output)),
        check=True,
    )
    record = load_json(output)
    print([round(point["test_accuracy"], 3) for point in record["curve"]])
    assert record["status"] == "ok" and record["image_size"] == 1
    assert record["input_channels"] == 8 and record["trainable_parameters"] == 4_931
    assert record["epochs_to_target"] is not None and record["final_test_accuracy"] >= 0.9
    assert record["test_class_names"] == ["GALAXY", "QSO", "STAR"]
    # Stars sit at redshift 0: once the table is learned, they are found.
    assert record["final_test_accuracy_per_class"][2] >= 0.9
    assert sum(record["test_examples_per_class"]) == 120  # a fifth of the 599 measured rows
    return record


@contextlib.contextmanager
def temp_folder_of_length(length: int, prefix: str):
    """A new folder whose path is `length` characters long, made at the
    system's temp folder (pytest's tmp_path may be longer already), removed
    after: a TMPDIR at the edge of what a decoding worker's socket allows."""
    top = Path(tempfile.mkdtemp(prefix=prefix))
    folder = top / ("x" * (length - len(str(top)) - 1))
    folder.mkdir()
    assert len(str(folder)) == length
    try:
        yield folder
    finally:
        shutil.rmtree(top)


def assert_trains_on_decoded_imagenet(tmp_path: Path, framework: str, dataset: str) -> dict:
    """`framework` on 2 replicas trains the small CNN for two timed blocks on
    generated ImageNet files (trainscale.core.imagenet), decoding them as it
    trains; its record has the pipeline's own rate, measured after the clock."""
    from trainscale.core.imagenet import SOCKET_PATH_LIMIT, WORKER_SOCKET_SUFFIX, generate_imagenet

    output = tmp_path / "run.json"
    data = generate_imagenet(str(tmp_path / "imagenet"), classes=4, per_class=8, shards=2)
    # The run's own temp folder, as long as a decoding worker's socket allows
    # (test_imagenet.py refuses one byte more).
    with temp_folder_of_length(SOCKET_PATH_LIMIT - WORKER_SOCKET_SUFFIX, "decoded-") as temp:
        trainscale(
            "run",
            *("--framework", framework, "--gpus-per-node", "2", "--device", "cpu"),
            *("--model", "small_cnn", "--image-size", "32", "--batch-size", "4"),
            *("--dataset", dataset, "--data-dir", data, "--loader-workers", "1"),
            *("--warmup-steps", "1", "--blocks", "2", "--steps-per-block", "2"),
            *("--output", str(output)),
            check=True,
            env={"TMPDIR": str(temp)},
        )
        # A loader's workers ended through their own exit, which removes the
        # folder multiprocessing made each one (torch_imagenet.stop_workers).
        left = sorted(p.name for p in temp.glob("pymp-*"))
    assert not left, left
    record = load_json(output)
    assert record["status"] == "ok" and record["dataset"] == dataset
    assert record["augmentation"] == "random-resized-crop-and-flip"
    assert record["images_per_sec"]["mean"] > 0 and record["input_pipeline_images_per_sec"] > 0
    ratio = record["input_pipeline_images_per_sec"] / record["images_per_sec"]["mean"]
    assert record["input_bound"] == (ratio < 1.1)
    return record
