"""The example scripts (examples/), run as `trainscale example` runs them, and
the harness's runs they are compared with (tests/examples/test_examples.py)."""

from __future__ import annotations

import re

from runs import GLOBAL_BATCH, gpt_run, trainscale

# The harness's default seed, and plain SGD: the update is linear in the
# gradient, so an example and the harness agree to float32 rounding.
EXAMPLE_SEED = "1234"
EXAMPLE_SGD = ["--optimizer", "sgd", "--learning-rate", "0.05", "--seed", EXAMPLE_SEED]
# A text example trains what the shared GPT runs train (runs.GPT_SHAPE): its
# model, sequence, vocabulary and learning rate, over the same global batch.
EXAMPLE_GPT = ["--model", "gpt-tiny", "--seq-len", "16"]
EXAMPLE_GPT_SGD = [*EXAMPLE_GPT, "--vocab-size", "96", "--optimizer", "sgd"]
EXAMPLE_GPT_SGD += ["--learning-rate", "0.5", "--seed", EXAMPLE_SEED]
# Measured on this code (AMD EPYC, 2 cores): equal to the 6 printed decimals
# for every framework (see the tests' printed lines).
EXAMPLE_LOSS_TOLERANCE = 1e-5


def example_cases():
    """Every example of every framework of each environment this Python runs
    at least one framework of (trainscale.launching.examples.Example:
    framework, workload): one its environment lacks fails here rather than
    vanishing. lightning-horovod's environment is its own
    (tests/lightning1 runs its example)."""
    from trainscale.catalogue.registry import REGISTRY
    from trainscale.launching.examples import examples_of

    environments = {spec.environment for spec in REGISTRY if not spec.missing_module()}
    return [
        e for spec in REGISTRY if spec.environment in environments for e in examples_of(spec.name)
    ]


# The code of an example that reads its real data: the data set, its batches.
DATA_CODE = ("load_cifar100", "CIFAR100", "TextWindows", "make_dataset", "batches")


def data_code(example) -> str:
    """A digest of the example's data-reading code: its DATA_CODE functions
    and classes, as parsed."""
    import ast
    import hashlib

    with open(example.path()) as handle:
        tree = ast.parse(handle.read())
    parts = [ast.dump(node) for node in tree.body if getattr(node, "name", None) in DATA_CODE]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def data_run_cases(examples) -> list:
    """The examples whose real-data run proves something: the first of each
    data_code. Another example with the same data code reads its batches
    with the same code, which takes its share by the rank and world size
    (or the strategy) that any launch kind's processes are given; its
    synthetic run (against the harness) proves those processes start and
    train as the harness's do, its loop taking real and synthetic batches
    alike. Keyed by launch kind too, five more runs re-read the same files
    (tf-multiworker, tf-ps, horovod-elastic, torch-elastic and
    horovod-torch-elastic: about 110 s of a pytest worker)."""
    seen: set[str] = set()
    cases = []
    for example in examples:
        code = data_code(example)
        if code not in seen:
            seen.add(code)
            cases.append(example)
    return cases


def example_replicas(framework: str, same_numbers: bool = False) -> int:
    """2 CPU replicas where the framework is distributed, else 1; and 1 where
    the run must give the same numbers twice (`same_numbers`) but an
    asynchronous framework's 2 workers update in whichever order they finish."""
    from trainscale.catalogue.registry import framework_spec

    spec = framework_spec(framework)
    return 1 if spec.one_device or (same_numbers and spec.asynchronous) else 2


def horovod_launcher(framework: str) -> list[str]:
    """horovodrun --gloo for a Horovod framework: the launcher the examples
    document, and here 6 s quicker to start than mpirun (tests/harness covers
    mpirun)."""
    from trainscale.catalogue.launch_kinds import HOROVOD
    from trainscale.catalogue.registry import framework_spec

    return ["--horovod-launcher", "gloo"] if framework_spec(framework).launch is HOROVOD else []


def run_example(example, *script_args: str, timeout: float = 600, same_numbers: bool = False):
    """`trainscale example FRAMEWORK --workload W` on its CPU replicas; its
    losses, step by step, and its output."""
    framework = example.framework
    replicas = example_replicas(framework, same_numbers)
    result = trainscale(
        "example",
        framework,
        *("--workload", example.workload),
        *("--replicas", str(replicas), "--timeout", str(timeout)),
        *horovod_launcher(framework),
        "--",
        *script_args,
        check=True,
        timeout=timeout + 60,
    )
    # horovodrun prefixes each rank's lines with "[rank]<stdout>:".
    stdout = re.sub(r"^\[\d+\]<stdout>:", "", result.stdout, flags=re.M)
    # Ray prefixes a worker's lines: "(RayTrainWorker pid=N) step 1/2: ...".
    ray_prefix = r"^(\x1b\[\d+m)?\(\w+ pid=\d+(, ip=[\d.]+)?\)(\x1b\[0m)? "
    stdout = re.sub(ray_prefix, "", stdout, flags=re.M)
    losses = [float(v) for v in re.findall(r"^step \d+/\d+: loss (\S+)$", stdout, re.M)]
    return losses, stdout


def example_data_run(example, archive_dir: str, text_file: str):
    """2 steps of the example on its real data: the CIFAR-100-format archive,
    or a text file (losses, stdout)."""
    if example.workload == "text":
        data = ["--text", text_file, *EXAMPLE_GPT]
    else:
        data = ["--data-dir", archive_dir]
    return run_example(example, *data, "--steps", "2", "--batch-size", "4")


def example_synthetic_run(example):
    """2 SGD steps of the example on the harness's synthetic batch: (losses,
    stdout). A text example's batch per replica makes the shared GPT runs'
    global batch (a pipeline's and a tensor-parallel group's ranks read it
    whole: its per-replica share is the same)."""
    replicas = example_replicas(example.framework, same_numbers=True)
    if example.workload == "text":
        training = ["--batch-size", str(GLOBAL_BATCH // replicas), *EXAMPLE_GPT_SGD]
    else:
        training = ["--batch-size", "2", *EXAMPLE_SGD]
    return run_example(example, "--synthetic", "--steps", "2", *training, same_numbers=True)


def reference_framework(example) -> str:
    """The framework whose harness run an example's loss is held to. A text
    example: its own framework's shared GPT run (the GPT equivalence tests
    run it). An image example: one run per ecosystem and replica count, its
    one-device framework's or its first data-parallel one's; the equivalence
    tests hold every other framework's harness to those, step for step.
    Among the frameworks of its base (registry.base_of): a Keras `fit`
    example's loss is fit's, the mean over its epoch so far."""
    from trainscale.catalogue.registry import REGISTRY, base_of, framework_spec

    spec = framework_spec(example.framework)
    if example.workload == "text":
        return spec.name
    replicas = example_replicas(spec.name, same_numbers=True)
    return next(
        s.name
        for s in REGISTRY
        if base_of(s.name) == base_of(spec.name)
        and (s.one_device if replicas == 1 else not (s.one_device or s.asynchronous))
        and not s.missing_module()  # lightning-horovod's environment has no Lightning 2
    )


def harness_reference_loss(run_store, example) -> float:
    """The harness's loss at step 2 for what example_synthetic_run trains, from
    a run shared by every example that trains the same (run_store.py)."""
    replicas = example_replicas(example.framework, same_numbers=True)
    framework = reference_framework(example)
    if example.workload == "text":
        return gpt_run(run_store, framework, replicas).record["final_loss"]
    shape = ["--model", "vgg16", "--image-size", "32", "--device", "cpu"]
    shape += ["--batch-size", "2", "--dataset", "synthetic", *EXAMPLE_SGD]
    shape += ["--warmup-steps", "1", "--blocks", "1", "--steps-per-block", "1"]
    args = ["--framework", framework, "--gpus-per-node", str(replicas), *shape]
    return run_store.run(*args, *horovod_launcher(framework)).record["final_loss"]
