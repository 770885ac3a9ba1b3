"""The `trainscale` command: `train` (one process), `run` (one grid point,
locally), `example` (a framework's example script, locally), `refactoring`
(how much each example changes its base) and `predict` (throughput past the
measured cells, from a study's throughput.csv)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from trainscale.registry import framework_spec, missing_module
from trainscale.settings import (
    DATASETS,
    DEVICES,
    FRAMEWORKS,
    HOROVOD_LAUNCHERS,
    MODELS,
    OPTIMIZERS,
    PRECISIONS,
    RunOptions,
    RunSettings,
    SettingsError,
    validate,
    with_global_batch,
)


class _Parser(argparse.ArgumentParser):
    """Errors on one line, naming the option, as every tool in a pipeline should."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _on_off(group, name: str, default: bool, what: str = "") -> None:
    """--NAME / --no-NAME, as argparse.BooleanOptionalAction (Python 3.9+) makes them;
    written out because the harness also runs on Python 3.8 (NVIDIA 23.03)."""
    flag = name.replace("_", "-")
    group.add_argument(
        f"--{flag}",
        dest=name,
        action="store_true",
        default=default,
        help=f"{what} (default: {'on' if default else 'off'}; --no-{flag} turns it off)".strip(),
    )
    group.add_argument(f"--no-{flag}", dest=name, action="store_false", help=argparse.SUPPRESS)


def _options() -> argparse.ArgumentParser:
    defaults = RunSettings(framework="tf-single")
    run_defaults = RunOptions()
    p = _Parser(add_help=False)
    grid = p.add_argument_group("grid point")
    grid.add_argument("--framework", required=True, help=f"one of {', '.join(FRAMEWORKS)}")
    grid.add_argument("--nodes", type=int, default=defaults.nodes)
    grid.add_argument("--gpus-per-node", type=int, default=defaults.gpus_per_node)
    grid.add_argument("--model", default=defaults.model, help=f"one of {', '.join(MODELS)}")
    batch = grid.add_mutually_exclusive_group()
    batch.add_argument(
        "--batch-size",
        type=int,
        default=defaults.batch_size,
        help="per replica (weak scaling, the paper's setting; default %(default)s)",
    )
    batch.add_argument(
        "--global-batch-size",
        type=int,
        help="split over all replicas instead (strong scaling); must divide evenly",
    )
    data = p.add_argument_group("data and device")
    data.add_argument("--image-size", type=int, default=defaults.image_size)
    data.add_argument("--dataset", default=defaults.dataset, help=f"one of {', '.join(DATASETS)}")
    data.add_argument("--data-dir", default=defaults.data_dir, help="holds cifar-100-python/")
    data.add_argument("--device", default=defaults.device, help=f"one of {', '.join(DEVICES)}")
    _on_off(data, "augment", defaults.augment)
    measure = p.add_argument_group("measurement")
    measure.add_argument("--warmup-steps", type=int, default=defaults.warmup_steps)
    measure.add_argument("--iterations", type=int, default=defaults.iterations)
    measure.add_argument("--steps-per-iteration", type=int, default=defaults.steps_per_iteration)
    measure.add_argument(
        "--time-budget-seconds",
        type=float,
        default=defaults.time_budget_seconds,
        metavar="SECONDS",
        help="stop timing blocks once they have taken this long (at least 2, at most "
        "--iterations); 0: time exactly --iterations blocks (default)",
    )
    measure.add_argument("--seed", type=int, default=defaults.seed)
    training = p.add_argument_group("training")
    training.add_argument(
        "--optimizer", default=defaults.optimizer, help=f"one of {', '.join(OPTIMIZERS)}"
    )
    training.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    training.add_argument(
        "--precision", default=defaults.precision, help=f"one of {', '.join(PRECISIONS)}"
    )
    _on_off(training, "xla", defaults.xla, "TensorFlow frameworks: XLA auto-clustering")
    _on_off(training, "compile", defaults.compile, "torch frameworks: torch.compile the model")
    _on_off(training, "channels_last", defaults.channels_last, "torch frameworks: NHWC layout")
    training.add_argument(
        "--horovod-launcher",
        default=defaults.horovod_launcher,
        help=f"how `run` starts Horovod ranks: {', '.join(HOROVOD_LAUNCHERS)}",
    )
    comms = p.add_argument_group("communication")
    comms.add_argument(
        "--horovod-compression",
        default=defaults.horovod_compression,
        help="gradients on the wire: none, or fp16 (hvd.Compression.fp16)",
    )
    comms.add_argument(
        "--horovod-fusion-threshold-mb",
        type=float,
        default=defaults.horovod_fusion_threshold_mb,
        metavar="MB",
        help="Horovod's tensor fusion buffer (HOROVOD_FUSION_THRESHOLD); 0 turns fusion off",
    )
    comms.add_argument(
        "--collective-implementation",
        default=defaults.collective_implementation,
        help="tf-multiworker's all-reduce: auto (NCCL on GPUs, RING on CPUs), ring or nccl",
    )
    comms.add_argument(
        "--all-reduce-pack-mb",
        type=float,
        default=defaults.all_reduce_pack_mb,
        metavar="MB",
        help="tf-multiworker: all-reduce gradients in packs of this size "
        "(CommunicationOptions.bytes_per_pack); 0: TensorFlow decides",
    )
    comms.add_argument(
        "--ddp-bucket-cap-mb",
        type=float,
        default=defaults.ddp_bucket_cap_mb,
        metavar="MB",
        help="torch-ddp: all-reduce gradients in buckets of this size (bucket_cap_mb)",
    )
    comms.add_argument(
        "--ddp-compression",
        default=defaults.ddp_compression,
        help="torch-ddp: gradients on the wire: none, or fp16 (the fp16_compress_hook)",
    )
    out = p.add_argument_group("output")
    out.add_argument("--output", help="where the JSON record goes (written atomically)")
    out.add_argument(
        "--save-weights",
        metavar="NPZ",
        help="also save initial and final trainable weights (used by the equivalence test)",
    )
    out.add_argument(
        "--attempt",
        type=int,
        default=1,
        metavar="N",
        help="(run) which attempt at this grid point this is (the workflow's retries)",
    )
    out.add_argument(
        "--attempts",
        type=int,
        default=0,
        metavar="M",
        help="(run) on attempt M or later, a failure still writes a record: status failed "
        "with the log's tail (0: never)",
    )
    out.add_argument(
        "--timeout",
        type=float,
        default=0,
        metavar="SECONDS",
        help="(run) stop every process after this long and record status timeout (0: none)",
    )
    out.add_argument(
        "--collective-timeout",
        type=float,
        default=run_defaults.collective_timeout,
        metavar="SECONDS",
        help="a collective that waits this long for a stalled rank fails the run "
        "(MultiWorkerMirrored, Horovod over Gloo, DDP; Horovod over MPI has no such "
        "timeout: the watchdog bounds it) (0: wait forever)",
    )
    out.add_argument(
        "--expect-cuda-devices",
        type=int,
        default=0,
        metavar="N",
        help="(train) fail unless CUDA_VISIBLE_DEVICES names at least N devices",
    )
    out.add_argument(
        "--requested-gpus-per-node",
        type=int,
        default=0,
        metavar="G",
        help="(run) the GPUs per node the job asked its scheduler for; each process "
        "must see its share",
    )
    return p


def parse(argv: list[str] | None = None):
    parser = _Parser(prog="trainscale", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    common = _options()
    commands.add_parser(
        "train", parents=[common], help="one process of a run (what srun/mpirun start)"
    )
    commands.add_parser("run", parents=[common], help="every process of one grid point, here")
    _example_parser(commands)
    _refactoring_parser(commands)
    _predict_parser(commands)
    argv = list(sys.argv[1:] if argv is None else argv)
    # `example`'s own options end at --; the script's follow.
    script_arguments = []
    if argv[:1] == ["example"] and "--" in argv:
        script_arguments = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    args = parser.parse_args(argv)
    if args.command in ("example", "refactoring", "predict"):
        args.arguments = script_arguments
        return args, None, None
    settings = RunSettings(**_fields_of(RunSettings, args))
    if args.global_batch_size is not None:
        settings = with_global_batch(settings, args.global_batch_size)
    options = RunOptions(**_fields_of(RunOptions, args, renamed={"save_weights": "weights_file"}))
    return args, settings, options


def _fields_of(kind, args, renamed=None) -> dict:
    """The parsed options that are fields of the dataclass `kind` (flag name -> field)."""
    values = {(renamed or {}).get(k, k): v for k, v in vars(args).items()}
    return {f.name: values[f.name] for f in dataclasses.fields(kind) if f.name in values}


def _example_parser(commands) -> None:
    p = commands.add_parser(
        "example",
        help="run a framework's example script (examples/) here, as `run` starts its ranks",
        description="Everything after -- goes to the script (e.g. -- --synthetic --steps 10).",
    )
    p.add_argument("framework", choices=FRAMEWORKS)
    p.add_argument("--replicas", type=int, default=1, help="GPUs, or CPU replicas (default 1)")
    p.add_argument("--device", choices=DEVICES, default="cpu")
    p.add_argument("--horovod-launcher", choices=HOROVOD_LAUNCHERS, default="mpi")
    p.add_argument("--timeout", type=float, default=0, help="stop it after this long (0: none)")


def _refactoring_parser(commands) -> None:
    p = commands.add_parser(
        "refactoring",
        help="how much each framework's example changes its single-device base",
        description="Writes refactoring.csv, .md and .tex, and a side-by-side diff per "
        "framework, to --output-dir.",
    )
    p.add_argument("--frameworks", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    p.add_argument("--output-dir", default=".")


def _predict_parser(commands) -> None:
    p = commands.add_parser(
        "predict",
        help="fit the step model to a study's records; predict a larger grid",
        description="Writes predicted.{csv,md,tex}, predicted_parameters.* and "
        "predicted_holdout.* and predicted.png to --output-dir. Needs no TensorFlow or torch.",
    )
    p.add_argument("throughput", help="a study's throughput.csv (results/STUDY/throughput.csv)")
    p.add_argument("--output-dir", default=".")
    # Defaults (trainscale.predict, with pandas) are read only when predicting:
    # the harness's environments have no pandas.
    p.add_argument("--nodes", type=int, nargs="+", help="default: 1 2 4 ... 64")
    p.add_argument("--gpus-per-node", type=int, nargs="+", help="default: 4")


def _predict(args) -> int:
    from trainscale.predict import PREDICT_GPUS_PER_NODE, PREDICT_NODES, write_predictions

    args.nodes = args.nodes or list(PREDICT_NODES)
    args.gpus_per_node = args.gpus_per_node or list(PREDICT_GPUS_PER_NODE)
    if not os.path.isfile(args.throughput):
        raise SettingsError(f"{args.throughput}: no such file (run the study's collect first)")
    if min(args.nodes + args.gpus_per_node) < 1:
        raise SettingsError("--nodes and --gpus-per-node must be at least 1")
    figures = [os.path.join(args.output_dir, f"predicted.{ext}") for ext in ("png", "pdf")]
    write_predictions(args.throughput, args.output_dir, figures, args.nodes, args.gpus_per_node)
    return 0


def _example(args) -> int:
    from trainscale.examples import example_plan
    from trainscale.launch import run_plan

    if args.replicas < 1:
        raise SettingsError("--replicas must be at least 1")
    spec = framework_spec(args.framework)
    if spec.one_device and args.replicas != 1:
        raise SettingsError(f"{args.framework} runs on one device: --replicas must be 1")
    plan = example_plan(
        args.framework, args.replicas, args.device, args.arguments, args.horovod_launcher
    )
    result = run_plan(plan, args.timeout)
    if result.timed_out:
        print(f"trainscale example: stopped after {result.seconds:.0f} s", file=sys.stderr)
    return 0 if result.code == 0 else 1


def _refactoring(args) -> int:
    from trainscale.refactoring import write_refactoring

    for path in write_refactoring(args.frameworks, args.output_dir):
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    prog = "trainscale"
    try:
        args, settings, options = parse(argv)
        prog = f"trainscale {args.command}"
        if args.command == "example":
            _require(args.framework)
            return _example(args)
        if args.command == "refactoring":
            return _refactoring(args)
        if args.command == "predict":
            return _predict(args)
        validate(settings)
        nonnegative = (
            "expect_cuda_devices",
            "requested_gpus_per_node",
            "timeout",
            "attempts",
            "collective_timeout",
        )
        for option in nonnegative:
            if getattr(args, option) < 0:
                raise SettingsError(f"--{option.replace('_', '-')} must be zero or positive")
        _require(settings.framework)
        if args.command == "train":
            return _train(settings, options)
        return _run(settings, options)
    except SettingsError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # one line for the user; the log keeps the traceback
        if os.environ.get("TRAINSCALE_TRACEBACK"):
            raise
        kind = type(err).__name__
        print(
            f"{prog}: error: {kind}: {str(err).splitlines()[0] if str(err) else ''}",
            file=sys.stderr,
        )
        return 1


def _require(framework: str) -> None:
    missing = missing_module(framework)
    if missing:
        spec = framework_spec(framework)
        raise SettingsError(
            f"--framework {framework} needs {missing}, which {sys.executable} "
            f"cannot import: run it from its environment ({spec.environment} in a study "
            f"config, built by make {spec.environment.replace('_', '-')})"
        )


# Exit code of a process that ran out of memory; `run` turns it into a record.
EXIT_OOM = 3


def mark_first_to_die() -> None:
    """Make the kernel's OOM killer pick this training process before its
    launcher, srun or mpirun, so they live to record `oom` (raising one's own
    oom_score_adj needs no privilege)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")
    except OSError:
        pass


def _train(settings: RunSettings, options: RunOptions) -> int:
    from trainscale.training import OutOfMemory, train

    mark_first_to_die()
    if options.collective_timeout:
        # Horovod's Gloo reads its timeout from its own variable, in hvd.init().
        os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(max(1, round(options.collective_timeout)))
    try:
        train(settings, options)
    except (OutOfMemory, MemoryError) as err:
        # Running out of memory is a result of this grid point, not a crash.
        # The launcher reads this line (from any rank) and writes the record.
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        print(f"trainscale train: out of memory: {first_line}", file=sys.stderr)
        return EXIT_OOM
    return 0


def own_log_tail(lines: int = 30) -> str:
    """The last lines of the file this process's stderr goes to (the job's log), if any."""
    from trainscale.records import log_tail

    try:
        path = os.readlink("/proc/self/fd/2")
    except OSError:
        path = ""
    sys.stderr.flush()
    if not os.path.isfile(path):
        return "(stderr is not a file: no log to quote)"
    return log_tail(path, lines)


def _run(settings: RunSettings, options: RunOptions) -> int:
    from trainscale.launch import launch
    from trainscale.records import atomic_write_json, outcome_record, read_record
    from trainscale.slurm import in_slurm_job, slurm_job_reason

    output = options.output or (
        f"trainscale-{settings.framework}-{settings.model}-n{settings.nodes}"
        f"g{settings.gpus_per_node}-b{settings.batch_size}.json"
    )
    result = launch(settings, dataclasses.replace(options, output=output))
    code = result.code
    outcome = None
    reason = slurm_job_reason() if result.terminated and in_slurm_job() else ""
    if result.timed_out:
        outcome = (
            "timeout",
            f"stopped by the watchdog after {result.seconds:.0f} s "
            "(--timeout, or the SLURM time limit less a margin)",
        )
    elif reason == "TimeLimit":
        outcome = ("timeout", f"SLURM ended the job at its time limit after {result.seconds:.0f} s")
    elif code != 0 and result.out_of_memory:
        outcome = ("oom", result.out_of_memory)
    elif code != 0 and options.attempts and options.attempt >= options.attempts:
        why = f"SIGTERM (SLURM reason: {reason or 'none given'})" if result.terminated else code
        outcome = ("failed", f"exited with {why}; log tail:\n{own_log_tail()}")
    if outcome:
        status, error = outcome
        atomic_write_json(output, outcome_record(settings, status, error, result.seconds))
        print(
            f"{settings.framework:<15} {settings.model} n{settings.nodes}g"
            f"{settings.gpus_per_node} b{settings.batch_size}: {status.upper()} after "
            f"{result.seconds:.1f} s ({error.splitlines()[0]}) -> {output}"
        )
        return 0
    if code != 0:
        print(f"trainscale run: error: {settings.framework} exited with {code}", file=sys.stderr)
        return code if code > 0 else 128 - code
    record = read_record(output)
    rate, per_replica = record["images_per_sec"], record["per_replica_images_per_sec"]
    print(
        f"{record['framework']:<15} {record['model']} n{record['nodes']}g{record['gpus_per_node']} "
        f"b{record['batch_size']} {record['device']}: "
        f"{rate['mean']:.1f} ± {rate['std']:.1f} images/sec total "
        f"({per_replica['mean']:.1f} per replica) -> {output}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
