"""lightning-horovod (Lightning 1.9's strategy="horovod", seed 003's
Pytorch_lightning_* rows) from its own environment: make test runs this
folder with .venv-lightning1's Python (make lightning1-env), where Lightning
1.9.5 comes before .venv-torch's 2.6.6.

Its launch kind is horovod-torch's (mpirun, or horovodrun --gloo), whose
failures the harness's and torch's suites already make happen; what is its
own is Lightning 1.9 driving the step: its weights after the shared run's 3
SGD steps equal torch-single's on the full batch, its record is a torch
run's, its accuracy-mode run (where the harness sets each epoch's learning
rate) trains as horovod-torch's does, and its example reaches the harness's
loss.
"""

import pytest
from example_runs import (
    EXAMPLE_LOSS_TOLERANCE,
    example_synthetic_run,
    harness_reference_loss,
)
from runs import (
    GLOBAL_BATCH,
    assert_trains_like_one_device,
    check_a_torch_run,
    framework_run,
    make_mnist_dir,
)

from trainscale.launching.examples import examples_of

pytestmark = pytest.mark.slow

# As tests/torch/test_equivalence.py's: float32 summation order only.
ATOL = 2e-6


def test_this_is_lightning_1_9():
    import pytorch_lightning as pl

    assert pl.__version__ == "1.9.5"


def test_two_ranks_train_as_one_device_does_and_record_a_torch_run(run_store, cifar_dir):
    reference = framework_run(run_store, cifar_dir, "torch-single", 1).weights()
    run = framework_run(run_store, cifar_dir, "lightning-horovod", 2)
    assert run.record["batch_size"] == GLOBAL_BATCH // 2
    # Lightning multiplies the learning rate by the ranks; the backend hands
    # it the global batch's divided by them, so the update is torch-single's.
    assert_trains_like_one_device(reference, run.weights(), ATOL, "lightning-horovod")
    check_a_torch_run(run.record, run.stdout, 2)
    assert run.record["provenance"]["pytorch_lightning"] == "1.9.5"


def test_the_example_reaches_the_harness_loss(run_store):
    (example,) = examples_of("lightning-horovod")
    losses, stdout = example_synthetic_run(example)
    harness = harness_reference_loss(run_store, example)
    assert len(losses) == 2, stdout
    print(f"{example.name}: example {losses[1]:.6f}, harness {harness:.6f}")
    assert abs(losses[0] - losses[1]) > 100 * EXAMPLE_LOSS_TOLERANCE  # the step moved it
    assert abs(losses[1] - harness) <= EXAMPLE_LOSS_TOLERANCE


def test_an_accuracy_run_trains_as_horovod_torch_does(run_store):
    """Lightning multiplies the learning rate by the ranks as its strategy
    sets up, after the harness has set the epoch's; a rate left multiplied
    (undone only where the optimizer was built) ended at loss 2.3114
    against horovod-torch's 2.3214 here."""
    data = run_store.folder("mnist", lambda root: make_mnist_dir(root, 256, 64, seed=5))
    accuracy = ["--gpus-per-node", "2", "--model", "small_cnn", "--batch-size", "32"]
    accuracy += ["--dataset", "mnist", "--data-dir", data, "--device", "cpu"]
    accuracy += ["--mode", "accuracy", "--epochs", "2", "--optimizer", "sgd"]
    accuracy += ["--learning-rate", "0.05", "--no-augment"]
    runs = {
        f: run_store.run("--framework", f, *accuracy)
        for f in ("lightning-horovod", "horovod-torch")
    }
    losses = {f: run.record["final_loss"] for f, run in runs.items()}
    print(losses)
    assert losses["lightning-horovod"] == pytest.approx(losses["horovod-torch"], rel=1e-5)
