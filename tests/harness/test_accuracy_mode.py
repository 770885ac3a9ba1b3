"""Accuracy mode's TensorFlow side: what happens before the clock.

TensorFlow's first call of a traced step optimises its graph; accuracy mode
makes that call before the clock on zero images and then puts the model and
optimizer back (tf_backend.TensorFlowBackend.compile_untouched). Nothing may
be learned there: the state after it must equal the state before, exactly.
"""

import json
import subprocess
import sys

import pytest
from runs import make_mnist_dir

# In a process of its own: MirroredStrategy's CPU replicas are logical devices,
# which TensorFlow refuses to set up once another test has started its runtime.
CHECK = """
import json, sys
import numpy as np
from trainscale.catalogue.options import RunOptions
from trainscale.catalogue.settings import RunSettings
from trainscale.core.datasets import load_dataset
from trainscale.frameworks import backend_class

settings = RunSettings(
    framework="tf-mirrored", gpus_per_node=2, model="small_cnn", batch_size=8, image_size=16,
    dataset="mnist", data_dir=sys.argv[1], device="cpu", mode="accuracy", learning_rate=0.1,
)
backend = backend_class(settings.framework)(settings, RunOptions())
backend.prepare()
with backend.distribution.scope():
    backend.optimizer.build(backend.model.trainable_variables)
before = [v.numpy().copy() for v in backend.model.variables]
backend.compile_untouched()
after = [v.numpy() for v in backend.model.variables]
result = {
    "unchanged": all(np.array_equal(b, a) for b, a in zip(before, after)),
    "iterations_before_training": int(backend.optimizer.iterations.numpy()),
}
backend.set_learning_rate(0.05)
backend.read_loss(backend.step())
moved = [v.numpy() for v in backend.model.variables]
result.update(
    iterations_after_a_step=int(backend.optimizer.iterations.numpy()),
    learning_rate=float(backend.optimizer.learning_rate.numpy()),
    moved=any(not np.array_equal(b, m) for b, m in zip(before, moved)),
    evaluation=[float(x) for x in backend.evaluate()],
    test_labels=np.bincount(load_dataset("mnist", sys.argv[1], "test")[1], minlength=10).tolist(),
)
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
    return make_mnist_dir(tmp_path_factory.mktemp("mnist"), train=96, test=20, seed=5)


def test_the_first_call_before_the_clock_learns_nothing(mnist_dir):
    # MirroredStrategy on 2 CPU replicas: its variables are assigned across replicas.
    run = subprocess.run(
        [sys.executable, "-c", CHECK, mnist_dir], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["unchanged"] and result["iterations_before_training"] == 0
    # The step it compiled is the one training uses: one real step moves the
    # weights, at the rate set for it.
    assert result["iterations_after_a_step"] == 1 and result["moved"]
    assert result["learning_rate"] == pytest.approx(0.05)
    # The test split: 20 examples, each counted once over the batches' padding,
    # and again class by class (MNIST's 10): each class's examples as the
    # split's labels have them, its correct ones summing to the whole's.
    loss_sum, correct, examples, *by_class = result["evaluation"]
    assert examples == 20 and 0 <= correct <= 20 and loss_sum > 0
    correct_by_class, examples_by_class = by_class[:10], by_class[10:]
    assert examples_by_class == result["test_labels"] and len(by_class) == 20
    assert sum(correct_by_class) == correct
    assert all(0 <= c <= e for c, e in zip(correct_by_class, examples_by_class))
