"""The `trainscale` command: `train` (one process), `run` (one grid point,
locally), `example` (a framework's example script, locally), `refactoring`
(how much each example changes its base), `predict` (throughput past the
measured cells, from a study's throughput.csv), `probe` (the network) and
`relabel` (a study folder's records moved to the paths of what they measured)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from trainscale.analysis.parallel_plan_report import plan_parser, run_plan
from trainscale.catalogue.options import OPTIONS, RunOptions, validate_options
from trainscale.catalogue.registry import FRAMEWORKS, REGISTRY, framework_spec
from trainscale.catalogue.settings import (
    SETTING,
    RunSettings,
    SettingsError,
    all_settings,
    validate,
    with_global_batch,
)
from trainscale.core.setting import add_argument
from trainscale.launching.run_point import run_point
from trainscale.launching.train_process import train_process
from trainscale.network.probe import TRANSPORTS, probe_parser, run_probe


class _Parser(argparse.ArgumentParser):
    """Errors on one line, naming the option, as every tool in a pipeline should."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _options() -> argparse.ArgumentParser:
    """`train` and `run`'s options: one flag per declared setting and run option."""
    p = _Parser(add_help=False)
    groups = {}
    for setting in (*all_settings(), *OPTIONS):
        if setting.group not in groups:
            groups[setting.group] = p.add_argument_group(setting.group)
        add_argument(groups[setting.group], setting)
        if setting.name == "batch_size":
            groups[setting.group].add_argument(
                "--global-batch-size",
                type=int,
                help="instead of --batch-size: split over all replicas (strong scaling); "
                "must divide evenly",
            )
    return p


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The `trainscale` parser and its commands' (the docs' CLI reference reads both)."""
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
    _relabel_parser(commands)
    probe_parser(commands)
    plan_parser(commands)
    return parser, dict(commands.choices)


def parse(argv: list[str] | None = None):
    parser, _ = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `example`'s own options end at --; the script's follow.
    script_arguments = []
    if argv[:1] == ["example"] and "--" in argv:
        script_arguments = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    args = parser.parse_args(argv)
    if args.command in ("example", "refactoring", "predict", "probe", "relabel", "plan"):
        args.arguments = script_arguments
        return args, None, None
    settings = RunSettings(**_fields_of(RunSettings, args))
    if args.global_batch_size is not None:
        settings = with_global_batch(settings, args.global_batch_size)
    options = RunOptions(**_fields_of(RunOptions, args))
    return args, settings, options


def _fields_of(kind, args) -> dict:
    """The parsed options that are fields of the dataclass `kind`."""
    values = vars(args)
    return {f.name: values[f.name] for f in dataclasses.fields(kind) if f.name in values}


def _launch_settings() -> list:
    """The settings the launch kinds read, each once."""
    found = {s.name: s for spec in REGISTRY for s in spec.launch.settings}
    return list(found.values())


def _example_parser(commands) -> None:
    p = commands.add_parser(
        "example",
        help="run a framework's example script (examples/) here, as `run` starts its ranks",
        description="Everything after -- goes to the script (e.g. -- --synthetic --steps 10).",
    )
    p.add_argument("framework", choices=FRAMEWORKS)
    p.add_argument(
        "--workload",
        choices=("image", "text"),
        help="which of its examples: VGG-16 on CIFAR-100, or a GPT on text "
        "(default: its first, images where it has one)",
    )
    p.add_argument("--replicas", type=int, default=1, help="GPUs, or CPU replicas (default 1)")
    add_argument(p, SETTING["device"], default="cpu")
    for setting in _launch_settings():  # how its processes are started
        add_argument(p, setting)
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
    # Defaults (trainscale.analysis.predict, with pandas) are read only when predicting:
    # the harness's environments have no pandas.
    p.add_argument("--nodes", type=int, nargs="+", help="default: 1 2 4 ... 64")
    p.add_argument("--gpus-per-node", type=int, nargs="+", help="default: 4")


def _relabel_parser(commands) -> None:
    p = commands.add_parser(
        "relabel",
        help="move a study's records filed in an old layout to what they measured",
        description="Records written before runs were labelled only by the knobs their "
        "framework reads (a DeepSpeed knob in a TensorFlow run's folder), or before a "
        "folder's knobs were joined by '+' (a comma named no SLURM job), move to the path "
        "of what they measured, with their logs.",
    )
    p.add_argument("folder", help="the study's folder (results/STUDY)")
    p.add_argument("--dry-run", action="store_true", help="say what would move; move nothing")


def _relabel(args) -> int:
    from trainscale.study.study_folder import relabel_records

    if not os.path.isdir(os.path.join(args.folder, "runs")):
        raise SettingsError(f"{args.folder}: no runs/ folder (give results/STUDY)")
    moved, refused = relabel_records(args.folder, args.dry_run)
    verb = "would move" if args.dry_run else "moved"
    for old, new in moved:
        print(f"{verb} {old} -> {new}")
    for old, new in refused:
        print(f"kept {old}: {new} holds the same run already; delete one of them")
    print(f"trainscale relabel: {len(moved)} {verb}, {len(refused)} kept")
    return 1 if refused else 0


def _predict(args) -> int:
    from trainscale.analysis.predict import PREDICT_GPUS_PER_NODE, PREDICT_NODES
    from trainscale.analysis.predict_report import write_predictions

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
    from trainscale.launching.examples import example_plan, examples_of
    from trainscale.launching.launch import run_plan

    if args.replicas < 1:
        raise SettingsError("--replicas must be at least 1")
    SETTING["device"].validate(args.device)
    for setting in _launch_settings():
        setting.validate(getattr(args, setting.name))
    spec = framework_spec(args.framework)
    if spec.one_device and args.replicas != 1:
        raise SettingsError(f"{args.framework} runs on one device: --replicas must be 1")
    found = [e for e in examples_of(args.framework) if args.workload in (None, e.workload)]
    if not found:
        raise SettingsError(f"{args.framework} has no example for --workload {args.workload}")
    plan = example_plan(found[0], args.replicas, args.device, args.arguments, args)
    result = run_plan(plan, args.timeout)
    if result.timed_out:
        print(f"trainscale example: stopped after {result.seconds:.0f} s", file=sys.stderr)
    return 0 if result.code == 0 else 1


def _refactoring(args) -> int:
    from trainscale.analysis.refactoring_report import write_refactoring

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
        if args.command == "relabel":
            return _relabel(args)
        if args.command == "plan":
            return run_plan(args)
        if args.command == "probe":
            _require(TRANSPORTS[args.transport].framework)
            return run_probe(args)
        validate(settings)
        validate_options(options)
        _require(settings.framework)
        if args.command == "train":
            return train_process(settings, options)
        return run_point(settings, options)
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
    missing = framework_spec(framework).missing_module()
    if missing:
        spec = framework_spec(framework)
        raise SettingsError(
            f"--framework {framework} needs {missing}, which {sys.executable} "
            f"lacks: run it from its environment ({spec.environment} in a study "
            f"config, built by make {spec.environment.replace('_', '-')})"
        )


if __name__ == "__main__":
    sys.exit(main())
