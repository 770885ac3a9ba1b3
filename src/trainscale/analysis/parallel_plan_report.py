"""`trainscale plan`'s command line and its table (the model:
trainscale.analysis.parallel_plan, imported when a plan is made: it needs
NumPy, which `trainscale`'s other commands need not load to parse flags).
Needs no TensorFlow, torch or pandas."""

from __future__ import annotations

import argparse
import csv
import os

from trainscale.core.gpt import GPT_SHAPES, gpt_shape, parameter_count
from trainscale.core.setting import SettingsError
from trainscale.harness.flops import PEAK_TFLOPS

GIB = 2**30
TERMS = ("compute", "bubble", "data", "tensor", "pipeline")
# StepTerms' fields as the plan's list names them, with the flag of each.
TERM_TEXT = {
    "flops_per_sec": ("a rank's compute, TFLOP/s achieved", "--mfu x --peak-tflops"),
    "intra_gb_per_s": ("bus bandwidth between a node's devices, GB/s", "--intra-gb-per-s"),
    "intra_latency_s": ("latency of a ring step in a node, µs", "none, no flag"),
    "inter_gb_per_s": ("one device's share of the network, GB/s", "--inter-gb-per-s"),
    "inter_latency_s": ("latency of a ring step across nodes, µs", "none, no flag"),
    "overlap": ("share of the backward pass the data-parallel exchange hides behind", "--overlap"),
    "tensor_call_s": ("a tensor-parallel all-reduce's own cost, µs", "none, no flag"),
    "send_s": ("a pipeline send's own cost, µs", "none, no flag"),
    "shard_call_s": ("a ZeRO-3 or FSDP2 call's own cost per ring step, µs", "none, no flag"),
    "partition_step_s": ("DeepSpeed ZeRO-1 or 2's own cost per step, µs", "none, no flag"),
    "model_error": ("the model's own error (widens every band), %", "none: no run to err on"),
}
MICRO = (
    "intra_latency_s", "inter_latency_s", "tensor_call_s", "send_s", "shard_call_s",
    "partition_step_s",
)  # fmt: skip
SCALE = {"flops_per_sec": 1e-12, "model_error": 100, **dict.fromkeys(MICRO, 1e6)}


def plan_parser(commands) -> None:
    p = commands.add_parser(
        "plan",
        help="rank every parallel configuration of a GPT on a cluster by predicted speed",
        description="Lists the data x tensor x pipeline configurations (with ZeRO stage, "
        "microbatches and activation checkpointing) that fit in a device's memory, fastest "
        "first, each term of the prediction labelled assumed where no record fits it. "
        "Hardware from the flags, or from a study config's cluster.systems entry.",
    )
    p.add_argument(
        "--model",
        required=True,
        type=_model,
        help=f"a ladder model ({', '.join(GPT_SHAPES)}) or a shape, L<layers>-H<hidden>-A<heads>",
    )
    p.add_argument("--seq-len", type=int, help="tokens a sequence (else a ladder model's context)")
    p.add_argument("--vocabulary", type=int, default=50257, help="default: GPT-2's, 50257")
    p.add_argument("--global-batch", type=int, default=512, help="sequences a step (default 512)")
    p.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, help="else the system's")
    p.add_argument("--device", choices=sorted(PEAK_TFLOPS), help="its data sheet's peak")
    p.add_argument("--peak-tflops", type=float, help="one device's dense peak at --precision")
    p.add_argument("--device-memory-gib", type=float, help="else the system's")
    p.add_argument("--config", help="a study config whose cluster.systems names --system")
    p.add_argument("--system", help="a node type of --config's cluster.systems")
    p.add_argument("--mfu", type=float, default=0.4, help="assumed share of the peak (0.4)")
    p.add_argument("--intra-gb-per-s", type=float, help="assumed bus bandwidth in a node")
    p.add_argument("--inter-gb-per-s", type=float, help="assumed network share of a device")
    p.add_argument("--overlap", type=float, default=0.0, help="assumed (none)")
    libraries = ("nccl", "gloo")  # gloo: CPUs, whose reduce-scatter is an all-reduce
    p.add_argument("--collectives", choices=libraries, default="nccl", help="default nccl")
    p.add_argument("--probe", nargs="+", metavar="JSON", help="trainscale probe records: the links")
    p.add_argument(
        "--reserved-gib",
        type=float,
        default=1.0,
        help="GiB the runtime holds besides tensors (CUDA context, slack; 1)",
    )
    p.add_argument(
        "--measured",
        metavar="THROUGHPUT_CSV",
        help="a study's throughput.csv: its records fit the terms they can "
        "(a rank's FLOP/s, the links, the overlap) and give the 95 %% bands",
    )
    p.add_argument("--headroom", type=float, default=0.1, help="share of memory kept free")
    p.add_argument("--top", type=int, default=10, help="configurations shown (default 10)")
    p.add_argument("--output-dir", help="also write parallel_plan.md and .csv there")
    p.add_argument(
        "--write-study",
        metavar="FILE",
        help="write the cells to measure next as a study config (run it with "
        "snakemake, then plan again with --measured)",
    )
    p.add_argument("--study-name", help="its study: name (default: plan-MODEL)")
    p.add_argument("--study-device", choices=("gpu", "cpu"), default="gpu", help="its runs' device")


def _system(args) -> dict:
    if not (args.config or args.system):
        return {}
    if not (args.config and args.system):
        raise SettingsError("--config and --system go together")
    import yaml

    with open(args.config) as handle:
        systems = (yaml.safe_load(handle).get("cluster") or {}).get("systems") or {}
    if args.system not in systems:
        raise SettingsError(
            f"{args.config} defines no system {args.system!r}; it defines "
            f"{', '.join(sorted(systems)) or 'none'}"
        )
    return systems[args.system]


def cluster_of(args, system: dict):
    """The cluster's shape and memory: the flags, else --system's fields."""
    from trainscale.analysis.parallel_plan import Cluster

    values = {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node or system.get("gpus_per_node"),
        "device_memory_gib": args.device_memory_gib or system.get("device_memory_gib"),
    }
    _require_positive(values)
    return Cluster(**values, collectives=args.collectives)


def _require_positive(values: dict) -> None:
    missing = [name for name, value in values.items() if not value or value <= 0]
    if missing:
        flags = ", ".join("--" + name.replace("_", "-") for name in missing)
        raise SettingsError(f"no positive {flags}: give it, or a --system that has it")


def step_terms_of(args, system: dict, workload):
    """(the terms, their refits, each one's label, the measured
    configurations, the terms before any fit): fitted where --measured's
    records can, else measured by --probe's or assumed from the flags and
    --system (a flag wins); one line names what is missing."""
    from trainscale.analysis.parallel_plan import StepTerms
    from trainscale.analysis.parallel_plan_fit import fit_terms
    from trainscale.analysis.parallel_plan_probe import probed_links, with_probed_links

    peak = args.peak_tflops or (system.get("peak_tflops") or {}).get(args.precision)
    if peak is None and args.device:
        peak = PEAK_TFLOPS[args.device].get(args.precision)
    assumed = StepTerms(
        flops_per_sec=args.mfu * (peak or 0) * 1e12,
        intra_gb_per_s=args.intra_gb_per_s or system.get("intra_node_gb_per_s") or 0,
        inter_gb_per_s=args.inter_gb_per_s or system.get("inter_node_gb_per_s") or 0,
        overlap=args.overlap,
    )
    labels = {name: f"assumed ({flag})" for name, (_, flag) in TERM_TEXT.items()}
    labels["flops_per_sec"] = f"assumed (--mfu {args.mfu:g} of a {peak or 0:g} TFLOP/s peak)"
    gradient = 4 * parameter_count(workload.model, workload.seq_len, workload.vocabulary)
    probed = probed_links(args.probe, gradient) if args.probe else {}
    assumed, _, labels = with_probed_links(assumed, (), labels, probed)
    if not args.measured:
        links = {n: getattr(assumed, n) for n in ("intra_gb_per_s", "inter_gb_per_s")}
        _require_positive({"peak_tflops": peak, **links})
        return assumed, (), labels, (), assumed
    if not os.path.isfile(args.measured):
        raise SettingsError(f"{args.measured}: no such file (run the study's collect first)")
    fitted = fit_terms(args.measured, workload, assumed)
    labels.update({name: text for name, text in fitted.labels.items() if text != "assumed"})
    terms, draws, labels = with_probed_links(fitted.terms, fitted.draws, labels, probed)
    unfitted = {n: getattr(terms, n) for n in ("intra_gb_per_s", "inter_gb_per_s")}
    _require_positive({n: v for n, v in unfitted.items() if labels[n].startswith("assumed")})
    return terms, draws, labels, fitted.measured, assumed


def _model(name: str) -> str:
    """--model's value, checked: argparse prints the one line a bad one gets."""
    try:
        gpt_shape(name)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return name


def run_plan(args) -> int:
    from trainscale.analysis.parallel_plan import MemoryBudget, Workload, plan
    from trainscale.analysis.parallel_plan_figure import checked, draw_predicted_against_measured
    from trainscale.analysis.parallel_plan_validation import render_validation, validate

    if not 0 < args.mfu <= 1 or not 0 <= args.overlap <= 1 or not 0 <= args.headroom < 1:
        raise SettingsError("--mfu must be in (0, 1], --overlap and --headroom in [0, 1)")
    system = _system(args)  # read once: the cluster's shape and the terms both use it
    cluster = cluster_of(args, system)
    shape = gpt_shape(args.model)
    if not (args.seq_len or shape.context):
        raise SettingsError(f"--model {args.model} is a shape: give its --seq-len")
    if args.write_study and args.model not in GPT_SHAPES:
        raise SettingsError(
            f"--write-study: {args.model} is a shape trainscale plans but does not train; "
            "plan a ladder model to write its cells"
        )
    workload = Workload(
        args.model,
        args.seq_len or shape.context,
        args.vocabulary,
        args.global_batch,
        args.precision,
        args.optimizer,
    )
    terms, draws, labels, measured, assumed = step_terms_of(args, system, workload)
    budget = MemoryBudget(args.reserved_gib, args.headroom)
    predictions = plan(cluster, workload, budget, terms, draws)
    pairs = checked(measured, terms, draws)
    text = render(predictions, cluster, workload, budget, args.top)
    text += render_terms(terms, labels) + render_measured(pairs)
    if args.measured:
        text += render_validation(validate(args.measured, workload, assumed))
    if args.write_study:
        text += write_study(args, predictions, cluster, workload, labels, measured)
    print(text, end="")
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, "parallel_plan.md"), "w") as handle:
            handle.write(text)
        write_csv(predictions, os.path.join(args.output_dir, "parallel_plan.csv"))
        if pairs:
            figure = os.path.join(args.output_dir, "predicted_vs_measured.png")
            draw_predicted_against_measured(pairs, figure)
    return 0 if any(p.fits for p in predictions) else 1


def write_study(args, predictions, cluster, workload, labels, measured) -> str:
    """The cells to measure next, as a study config at --write-study; what
    the plan says of them."""
    import yaml

    from trainscale.analysis.parallel_plan_study import next_cells, study_config

    cells = next_cells(predictions, cluster, labels, measured)
    name = args.study_name or f"plan-{workload.model}"
    config = study_config(name, cells, workload, cluster, args.study_device)
    with open(args.write_study, "w") as handle:
        yaml.safe_dump(config, handle, sort_keys=False)
    lines = ["", f"To measure next ({args.write_study}, study {name}):", ""]
    for framework, nodes, gpus, knobs, why in cells:
        knob_text = "".join(f" {k}={v}" for k, v in knobs.items())
        lines.append(f"- {framework}{knob_text} on {nodes} x {gpus}: {why}")
    return "\n".join(lines) + "\n"


def render(predictions, cluster, workload, budget, top: int) -> str:
    w, c = workload, cluster
    parameters = parameter_count(w.model, w.seq_len, w.vocabulary)
    usable = (1 - budget.headroom) * c.device_memory_gib
    fitting = [p for p in predictions if p.fits]
    lines = [
        f"# {w.model} ({_count(parameters)} parameters, {w.seq_len} tokens, "
        f"batch {w.global_batch}, {w.precision}, {w.optimizer}) on {c.nodes} x "
        f"{c.gpus_per_node} devices of {c.device_memory_gib:g} GiB",
        "",
        f"{len(fitting)} of {len(predictions)} configurations fit in {usable:.1f} GiB "
        f"({budget.headroom:.0%} of each device's memory kept free, "
        f"{budget.reserved_gib:g} GiB of it the runtime's).",
        "",
        "| # | configuration | runs as | GiB a rank | step (s) | tokens/sec | 95 % band | "
        + " | ".join(f"{t} (s)" for t in TERMS)
        + " |",
        "|" + "---|" * (7 + len(TERMS)),
    ]
    lines += [_row(rank, p) for rank, p in enumerate(fitting[:top], 1)]
    too_big = [p for p in predictions if not p.fits]
    if too_big:
        needs = sum(too_big[0].memory_bytes.values()) / GIB
        verb = "does" if len(too_big) == 1 else "do"
        lines += [
            "",
            f"{len(too_big)} {verb} not fit; the fastest of them, "
            f"{too_big[0].configuration.name}, needs {needs:.1f} GiB a rank.",
        ]
    return "\n".join(lines) + "\n"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def _band(p) -> str:
    if p.band is None:
        return "none: assumed"
    return f"{p.band[0]:,.0f}-{p.band[1]:,.0f}"


def _row(rank: int, p) -> str:
    runs_as = ", ".join(p.configuration.runs_as()) or "predicted only"
    memory = sum(p.memory_bytes.values()) / GIB
    terms = " | ".join(f"{p.seconds[t]:.3g}" for t in TERMS)
    return (
        f"| {rank} | {p.configuration.name} | {runs_as} | {memory:.1f} | "
        f"{p.step_seconds:.3g} | {p.tokens_per_sec:,.0f} | {_band(p)} | {terms} |"
    )


def render_terms(terms, labels: dict) -> str:
    """Each term's number and where it came from."""
    lines = ["", "The terms (each fitted to the records of --measured, or assumed):", ""]
    for name, (text, _) in TERM_TEXT.items():
        value = getattr(terms, name) * SCALE.get(name, 1)
        lines.append(f"- {text}: {value:.4g}, {labels[name]}")
    if not any(label.startswith("fitted") for label in labels.values()):
        lines += [
            "",
            "No 95 % band: every term is assumed, none fitted to a measurement, "
            "so the spread of a fit cannot be shown.",
        ]
    return "\n".join(lines) + "\n"


def render_measured(pairs) -> str:
    """Each configuration the study measured beside the plan's prediction of
    it (parallel_plan_figure.checked)."""
    if not pairs:
        return ""
    lines = [
        "",
        "Measured in --measured's study, and predicted with the terms above:",
        "",
        "| configuration | run as | model | batch | measured tokens/sec | predicted | "
        "95 % band | error (%) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for pair in pairs:
        m, p = pair.measured, pair.predicted
        lines.append(
            f"| {m.configuration.name} | {m.framework} | {m.workload.model} | "
            f"{m.workload.global_batch} | "
            f"{m.tokens_per_sec:,.0f} | {p.tokens_per_sec:,.0f} | {_band(p)} | "
            f"{pair.error_percent:+.1f} |"
        )
    return "\n".join(lines) + "\n"


CSV_COLUMNS = [
    "configuration",
    "data",
    "tensor",
    "pipeline",
    "shard_stage",
    "microbatches",
    "checkpointing",
    "runs_as",
    "fits",
    "memory_gib",
    "step_seconds",
    "tokens_per_sec",
    "band_low",
    "band_high",
    *[f"{t}_seconds" for t in TERMS],
]


def write_csv(predictions: list, path: str) -> None:
    with open(path, "w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(CSV_COLUMNS)
        for p in predictions:
            c = p.configuration
            band = p.band or ("", "")
            out.writerow(
                [
                    c.name,
                    c.data,
                    c.tensor,
                    c.pipeline,
                    c.shard_stage,
                    c.microbatches,
                    c.checkpointing,
                    ";".join(c.runs_as()) or "predicted only",
                    p.fits,
                    round(sum(p.memory_bytes.values()) / GIB, 3),
                    round(p.step_seconds, 6),
                    round(p.tokens_per_sec, 1),
                    *band,
                    *[round(p.seconds[t], 6) for t in TERMS],
                ]
            )
