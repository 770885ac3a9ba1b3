"""The harness's own overhead, measured: ratios of runs made side by side.

Run by bench/run.py with the training environment (.venv-train); prints one
JSON object on stdout. Every ratio compares measurements made in this one
invocation, alternating (A, B, A, B, ...), and takes medians, so slow drift
of the machine hits both sides alike: timed blocks interleaved in one process
where both sides can live in one process (harness vs Keras, CIFAR-100 vs
synthetic input), whole `trainscale run` processes where they cannot (each
framework's launcher, one replica).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from common import (  # noqa: E402
    harness_against,
    interleaved_blocks,
    median,
    one_replica_each,
    ratio_interval,
    timed_block,
)

from trainscale.catalogue.options import RunOptions  # noqa: E402
from trainscale.catalogue.registry import REGISTRY  # noqa: E402
from trainscale.catalogue.settings import RunSettings  # noqa: E402
from trainscale.core.datasets import generate_cifar100, load_dataset  # noqa: E402
from trainscale.frameworks import backend_class  # noqa: E402
from trainscale.frameworks.tensorflow.keras_models import build_model  # noqa: E402
from trainscale.frameworks.tensorflow.strategies import create_distribution  # noqa: E402
from trainscale.frameworks.tensorflow.tf_backend import (  # noqa: E402
    build_train_step,
    make_dataset_fn,
    make_optimizer,
)
from trainscale.frameworks.tensorflow.tf_data import image_dataset  # noqa: E402
from trainscale.harness.backend import Topology  # noqa: E402


def _distribution_class(settings: RunSettings):
    """The tf.distribute or Horovod class of the settings' framework (its registry entry's)."""
    return backend_class(settings.framework).distribution_class


def harness_step(settings: RunSettings, dataset_fn=None):
    """The harness's own compiled training step (tf_backend.build_train_step) on its
    framework, model and optimizer: returns a function running one step."""
    distribution = create_distribution(
        _distribution_class(settings), settings, RunOptions(), Topology()
    )
    tf.keras.utils.set_random_seed(settings.seed)
    with distribution.scope():
        model = build_model(settings.model, settings.image_size, settings.num_classes)
        optimizer = make_optimizer(settings)
    step = build_train_step(distribution, model, optimizer, settings)
    batches = distribution.make_iterator(dataset_fn or make_dataset_fn(settings))
    return lambda: step(batches)


def keras_step(settings: RunSettings):
    """Keras's compiled train step, what `model.fit` calls once per step, on the
    same model, optimizer, loss, data and batch; returns a function running one step."""
    tf.keras.utils.set_random_seed(settings.seed)
    model = build_model(settings.model, settings.image_size, settings.num_classes)
    model.compile(
        optimizer=make_optimizer(settings),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    train_function = model.make_train_function()
    batches = iter(make_dataset_fn(settings)(0, 1, settings.batch_size))
    return lambda: train_function(batches)["loss"]


def pipeline_rate(data_dir: str, batch_size: int, batches: int = 300) -> float:
    """images/sec the CIFAR-100 input pipeline alone delivers (augmentation on)."""
    images, labels = load_dataset("cifar100", data_dir)
    dataset = image_dataset(
        images, labels, shard_index=0, num_shards=1, batch_size=batch_size, seed=1, augment=True
    )
    iterator = iter(dataset)
    for _ in range(20):  # fill the cache and the prefetch buffer
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * batch_size / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    measure = dict(warmup_steps=2, blocks=4, steps_per_block=8, device=args.device)
    results: dict = {}
    work = tempfile.mkdtemp(prefix="trainscale-bench-")

    rounds = 3 * args.repeats

    # 1. Harness vs Keras, same process, blocks interleaved.
    def settings_for(model):
        return RunSettings(
            framework="tf-single", model=model, batch_size=32, image_size=32,
            dataset="synthetic", **measure,
        )  # fmt: skip

    results["harness_vs_keras"] = harness_against(
        "keras_fit",
        lambda settings: (harness_step(settings), keras_step(settings)),
        settings_for,
        rounds,
    )

    # 3. Input headroom: the CIFAR-100 pipeline alone, and training on it
    # against training on synthetic batches (VGG-16, the study's model), one
    # model fed by the two pipelines in interleaved blocks.
    data_dir = os.path.join(work, "data")
    generate_cifar100(data_dir, 2048, seed=0)
    vgg = RunSettings(framework="tf-single", model="vgg16", batch_size=32, image_size=32, **measure)
    steps = measure["steps_per_block"]
    images = vgg.batch_size * steps
    cifar = dataclasses.replace(vgg, dataset="cifar100", data_dir=data_dir)
    synthetic = dataclasses.replace(vgg, dataset="synthetic")
    distribution = create_distribution(_distribution_class(cifar), cifar, RunOptions(), Topology())
    with distribution.scope():
        model = build_model(vgg.model, vgg.image_size, vgg.num_classes)
        optimizer = make_optimizer(vgg)
    step = build_train_step(distribution, model, optimizer, vgg)
    cifar_batches = distribution.make_iterator(make_dataset_fn(cifar))
    synthetic_batches = distribution.make_iterator(make_dataset_fn(synthetic))
    rates = interleaved_blocks(
        {
            "cifar100": timed_block(lambda: step(cifar_batches), steps, images),
            "synthetic": timed_block(lambda: step(synthetic_batches), steps, images),
        },
        rounds,
    )
    pipeline = [pipeline_rate(data_dir, vgg.batch_size) for _ in range(args.repeats)]
    results["input"] = {
        "pipeline_images_per_sec": median(pipeline),
        "cifar100_training_images_per_sec": median(rates["cifar100"]),
        "synthetic_training_images_per_sec": median(rates["synthetic"]),
        "headroom": median(pipeline) / median(rates["cifar100"]),
        "cifar100_over_synthetic": median(rates["cifar100"]) / median(rates["synthetic"]),
        "cifar100_over_synthetic_interval_95": ratio_interval(
            rates["cifar100"], rates["synthetic"]
        ),
        "block_rates": {**rates, "pipeline": pipeline},
    }

    # 2 and 4. One replica through each framework's real launch path
    # (mpirun for Horovod, TF_CONFIG for MultiWorker), alternating.
    # tf-single first: every ratio is against it.
    results["one_replica"] = one_replica_each(
        dataclasses.replace(synthetic, blocks=8),
        tuple(spec.name for spec in REGISTRY if spec.ecosystem == "tensorflow"),
        work,
    )
    # 2b. Where a one-replica Horovod run's cost goes: Horovod's step (its
    # DistributedGradientTape over one rank: hvd.init() in this process)
    # against tf-single's, in one process, blocks interleaved. Last: an MPI
    # singleton's variables in this process would make every mpirun started
    # from it refuse to run (inside an MPI job).
    results["horovod_step_vs_single"] = harness_against(
        "tf_single",
        lambda settings: (
            harness_step(dataclasses.replace(settings, framework="horovod")),
            harness_step(settings),
        ),
        settings_for,
        rounds,
    )

    results["settings"] = {
        "model": "vgg16/small_cnn",
        "batch_size": 32,
        "image_size": 32,
        **measure,
    }
    json.dump(results, sys.stdout, indent=2)


if __name__ == "__main__":
    main()
