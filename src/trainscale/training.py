"""The one training step and the timed benchmark loop, shared by every framework."""

from __future__ import annotations

import os
import socket
import sys

import numpy as np

from trainscale import records
from trainscale.data import cifar100_dataset, load_cifar100, prepare_images, synthetic_dataset
from trainscale.flops import training_flops_per_image, utilisation
from trainscale.frameworks import Framework, create_framework, require_cuda_devices
from trainscale.models import build_model
from trainscale.settings import RunSettings
from trainscale.timing import BlockBudget, BlockTimes, Stopwatch

_POLICIES = {"fp32": "float32", "fp16": "mixed_float16", "bf16": "mixed_bfloat16"}


def log(message: str) -> None:
    print(f"[trainscale] {message}", file=sys.stderr, flush=True)


def make_optimizer(settings: RunSettings):
    import tensorflow as tf

    if settings.optimizer == "adam":
        optimizer = tf.keras.optimizers.Adam(settings.learning_rate)
    else:
        optimizer = tf.keras.optimizers.SGD(settings.learning_rate)
    if settings.precision == "fp16":
        # float16 gradients underflow without loss scaling; bfloat16 has
        # float32's exponent range and needs none.
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def make_dataset_fn(settings: RunSettings):
    """dataset_fn(shard_index, num_shards, per_replica_batch) for Framework.make_iterator."""
    if settings.dataset == "cifar100":
        images, labels = load_cifar100(settings.data_dir)

        def dataset_fn(shard_index, num_shards, batch_size):
            return cifar100_dataset(
                images,
                labels,
                shard_index=shard_index,
                num_shards=num_shards,
                batch_size=batch_size,
                seed=settings.seed,
                augment=settings.augment,
            )

    else:

        def dataset_fn(shard_index, num_shards, batch_size):
            return synthetic_dataset(
                shard_index=shard_index,
                batch_size=batch_size,
                image_size=settings.image_size,
                num_classes=settings.num_classes,
                seed=settings.seed,
            )

    return dataset_fn


def build_train_step(framework: Framework, model, optimizer, settings: RunSettings):
    """The training step every framework runs: one definition, compiled once.

    Per replica: prepare the batch, forward, loss divided by the GLOBAL batch,
    gradients through the framework's tape (Horovod sums them there), apply
    (tf.distribute's optimizer sums them there). Returns the global mean loss.
    """
    import tensorflow as tf

    loss_per_example = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE
    )
    loss_scaling = settings.precision == "fp16"
    compute_dtype = model.compute_dtype

    def replica_step(images, labels):
        images = prepare_images(images, settings.image_size, compute_dtype)
        with tf.GradientTape() as tape:
            logits = tf.cast(model(images, training=True), tf.float32)
            loss = tf.nn.compute_average_loss(
                loss_per_example(labels, logits), global_batch_size=settings.global_batch_size
            )
            objective = optimizer.get_scaled_loss(loss) if loss_scaling else loss
        tape = framework.wrap_tape(tape)
        gradients = tape.gradient(objective, model.trainable_variables)
        if loss_scaling:
            gradients = optimizer.get_unscaled_gradients(gradients)
        # One gradient per variable by construction (zip(strict=) is 3.10+).
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    # The step takes the iterator and draws its batch inside the compiled
    # function, as Keras's train function does: no Python-side next() and no
    # argument conversion per step (10% of a small model's step on a CPU).
    @tf.function
    def train_step(iterator):
        return framework.run(replica_step, next(iterator))

    return train_step


def peak_memory(framework: Framework) -> dict:
    """Peak memory of this process: the GPU allocator's peak, else the peak RSS."""
    if framework.settings.device == "gpu":
        import tensorflow as tf

        peaks = [
            tf.config.experimental.get_memory_info(d.name)["peak"]
            for d in tf.config.list_logical_devices("GPU")
        ]
        return {"bytes": int(max(peaks)) if peaks else None, "source": "tf gpu allocator peak"}
    import resource

    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"bytes": int(rss_kib) * 1024, "source": "process peak RSS (CPU run)"}


def software_versions() -> dict:
    import keras
    import tensorflow as tf

    build = tf.sysconfig.get_build_info()
    versions = {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "cuda": build.get("cuda_version"),
        "cudnn": build.get("cudnn_version"),
        "horovod": None,
        "horovod_nccl": None,
    }
    try:
        import horovod
        import horovod.tensorflow as hvd

        versions["horovod"] = horovod.__version__
        versions["horovod_nccl"] = hvd.nccl_built() or None
    except ImportError:
        pass
    return versions


def process_age() -> float:
    """Seconds since this process started (interpreter start-up and imports included)."""
    try:
        with open("/proc/self/stat") as handle:
            start_ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as handle:
            uptime = float(handle.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def device_name(settings: RunSettings) -> str:
    """What the replicas run on: the GPU's name as the driver gives it, or the CPU model."""
    if settings.device == "gpu":
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        details = tf.config.experimental.get_device_details(gpus[0]) if gpus else {}
        return details.get("device_name", "unknown GPU")
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def process_description(framework: Framework) -> dict:
    return {
        "process": framework.process_index,
        "host": socket.gethostname(),
        "devices": framework.devices,
        "replicas": framework.replicas_in_process,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def train(
    settings: RunSettings,
    output: str | None = None,
    weights_file: str | None = None,
    expect_cuda_devices: int = 0,
):
    """Run one process of a benchmark; the chief writes the record. Returns it (or None)."""
    clock = Stopwatch()
    started_at = records.utc_now()
    if expect_cuda_devices:
        require_cuda_devices(expect_cuda_devices)
    if settings.xla and settings.device == "cpu":
        # XLA auto-clustering only touches CPU ops with this flag; it must be
        # in the environment before TensorFlow reads its flags.
        os.environ["TF_XLA_FLAGS"] = (
            os.environ.get("TF_XLA_FLAGS", "") + " --tf_xla_cpu_global_jit"
        ).strip()
    import tensorflow as tf

    framework = create_framework(settings)
    if settings.xla:
        # Auto-clustering compiles what XLA can and leaves the rest, which
        # keeps Horovod's collectives (not XLA ops) working.
        tf.config.optimizer.set_jit("autoclustering")
    tf.keras.mixed_precision.set_global_policy(_POLICIES[settings.precision])
    tf.keras.utils.set_random_seed(settings.seed)

    with framework.scope():
        model = build_model(settings.model, settings.image_size, settings.num_classes)
        optimizer = make_optimizer(settings)
    iterator = framework.make_iterator(make_dataset_fn(settings))
    train_step = build_train_step(framework, model, optimizer, settings)
    initial_weights = [v.numpy() for v in model.trainable_variables] if weights_file else None

    who = f"{settings.framework} {settings.model} {settings.replicas} replica(s)"
    if framework.is_chief:
        log(f"{who}: warm-up, {settings.warmup_steps} step(s)")
    for step in range(settings.warmup_steps):
        loss = train_step(iterator)
        if step == 0:
            framework.after_first_step(model, optimizer)
    float(loss)
    startup_seconds = clock.elapsed()
    seconds_to_first_timed_step = process_age()

    blocks = BlockTimes(
        images_per_block=settings.batch_size
        * framework.replicas_in_process
        * settings.steps_per_iteration,
        replicas_in_process=framework.replicas_in_process,
        steps_per_block=settings.steps_per_iteration,
    )
    budget = BlockBudget(settings.iterations, settings.time_budget_seconds)
    for block in range(settings.iterations):
        block_clock = Stopwatch()
        for _ in range(settings.steps_per_iteration):
            loss = train_step(iterator)
        # Reading the loss waits for the last step: the device sync that ends
        # the block. Nothing else leaves the device inside the timed region.
        loss_value = float(loss)
        seconds = block_clock.elapsed()
        # Outside the timed region: every process's rate, loss share and seconds.
        gathered = framework.gather_rows(
            np.array([blocks.local_rate(seconds), loss_value, seconds])
        )
        total = blocks.add(seconds, gathered[:, 0])
        if not framework.loss_is_global:
            loss_value = float(gathered[:, 1].sum())
        if framework.is_chief:
            log(
                f"{who}: block {block + 1}/{settings.iterations} "
                f"{total:.1f} img/s total, {total / settings.replicas:.1f} per replica, "
                f"{seconds / settings.steps_per_iteration * 1000:.1f} ms/step, "
                f"loss {loss_value:.4f}"
            )
        if budget.done_after(float(gathered[:, 2].max())):
            break

    processes = framework.gather_json(
        {**process_description(framework), "peak_memory": peak_memory(framework)}
    )
    if not framework.is_chief:
        return None

    summary = blocks.summary()
    name = device_name(settings)
    record = {
        **records.record_head(settings, "ok"),
        "replicas": framework.num_replicas,  # as the framework counted them
        "processes": framework.num_processes,
        **summary,
        "device_name": name,
        **utilisation(
            summary["images_per_sec"]["mean"],
            training_flops_per_image(settings.model, settings.image_size, settings.num_classes),
            framework.num_replicas,
            name,
            settings.precision,
        ),
        # In the process: model build, tracing, warm-up. From process start:
        # interpreter, imports and rendezvous too, up to the first timed step.
        "startup_seconds": startup_seconds,
        "seconds_to_first_timed_step": seconds_to_first_timed_step,
        "final_loss": loss_value,
        "peak_memory_bytes": max((p["peak_memory"]["bytes"] or 0) for p in processes) or None,
        "peak_memory_source": processes[0]["peak_memory"]["source"],
        "source": "measured",
        "provenance": {
            **records.host_provenance(),
            **software_versions(),
            "hosts": [p["host"] for p in processes],
            "processes": processes,
            "started_at": started_at,
            "finished_at": records.utc_now(),
        },
    }
    if output:
        records.atomic_write_json(output, record)
    if weights_file:
        final = [v.numpy() for v in model.trainable_variables]
        arrays = {f"initial_{i}": w for i, w in enumerate(initial_weights)}
        arrays.update({f"final_{i}": w for i, w in enumerate(final)})
        np.savez(weights_file, **arrays)
    log(
        f"{who}: {record['images_per_sec']['mean']:.1f} ± {record['images_per_sec']['std']:.1f} "
        f"img/s total over {summary['blocks']} blocks"
    )
    return record
