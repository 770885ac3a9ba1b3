"""`trainscale plan`'s command line and its table (the model:
trainscale.analysis.parallel_plan, imported when a plan is made: it needs
NumPy, which `trainscale`'s other commands need not load to parse flags).
Needs no TensorFlow, torch or pandas."""

from __future__ import annotations

import csv
import os

from trainscale.core.gpt import GPT_SHAPES, parameter_count
from trainscale.core.setting import SettingsError
from trainscale.harness.flops import PEAK_TFLOPS

GIB = 2**30
TERMS = ("compute", "bubble", "data", "tensor", "pipeline")
ASSUMED = {
    "mfu": "share of the device's peak a rank's compute reaches",
    "overlap": "share of the backward pass the data-parallel exchange hides behind",
    "reserved_gib": "GiB the runtime holds besides tensors (CUDA context, allocator slack)",
    "intra_gb_per_s": "GB/s of bus bandwidth between a node's devices",
    "inter_gb_per_s": "GB/s of one device's share of the network",
}


def plan_parser(commands) -> None:
    p = commands.add_parser(
        "plan",
        help="rank every parallel configuration of a GPT on a cluster by predicted speed",
        description="Lists the data x tensor x pipeline configurations (with ZeRO stage, "
        "microbatches and activation checkpointing) that fit in a device's memory, fastest "
        "first, each term of the prediction labelled assumed where no record fits it. "
        "Hardware from the flags, or from a study config's cluster.systems entry.",
    )
    p.add_argument("--model", required=True, choices=sorted(GPT_SHAPES))
    p.add_argument("--seq-len", type=int, help="tokens a sequence (default: the model's context)")
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
    for name, text in ASSUMED.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=float, help=f"assumed: {text}")
    p.add_argument("--headroom", type=float, default=0.1, help="share of memory kept free")
    p.add_argument("--top", type=int, default=10, help="configurations shown (default 10)")
    p.add_argument("--output-dir", help="also write parallel_plan.md and .csv there")


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


def cluster_of(args):
    """The flags, else --system's fields (a flag wins); one line names what is missing."""
    from trainscale.analysis.parallel_plan import Cluster

    system = _system(args)
    peak = args.peak_tflops or (system.get("peak_tflops") or {}).get(args.precision)
    if peak is None and args.device:
        peak = PEAK_TFLOPS[args.device].get(args.precision)
    values = {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node or system.get("gpus_per_node"),
        "device_memory_gib": args.device_memory_gib or system.get("device_memory_gib"),
        "peak_tflops": peak,
        "intra_gb_per_s": args.intra_gb_per_s or system.get("intra_node_gb_per_s"),
        "inter_gb_per_s": args.inter_gb_per_s or system.get("inter_node_gb_per_s"),
    }
    missing = [name for name, value in values.items() if not value or value <= 0]
    if missing:
        flags = ", ".join("--" + name.replace("_", "-") for name in missing)
        raise SettingsError(f"no positive {flags}: give it, or a --system that has it")
    return Cluster(**values)


def run_plan(args) -> int:
    from trainscale.analysis.parallel_plan import Assumptions, Workload, plan

    cluster = cluster_of(args)
    shape = GPT_SHAPES[args.model]
    workload = Workload(
        args.model,
        args.seq_len or shape.context,
        args.vocabulary,
        args.global_batch,
        args.precision,
        args.optimizer,
    )
    assumed = Assumptions(
        mfu=args.mfu or Assumptions.mfu,
        overlap=args.overlap or Assumptions.overlap,
        reserved_gib=args.reserved_gib if args.reserved_gib is not None else 1.0,
        headroom=args.headroom,
    )
    if not 0 < assumed.mfu <= 1 or not 0 <= assumed.overlap <= 1 or not 0 <= args.headroom < 1:
        raise SettingsError("--mfu must be in (0, 1], --overlap and --headroom in [0, 1)")
    predictions = plan(cluster, workload, assumed)
    text = render(predictions, cluster, workload, assumed, args.top)
    print(text, end="")
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, "parallel_plan.md"), "w") as handle:
            handle.write(text)
        write_csv(predictions, os.path.join(args.output_dir, "parallel_plan.csv"))
    return 0 if any(p.fits for p in predictions) else 1


def render(predictions, cluster, workload, assumed, top: int) -> str:
    w, c = workload, cluster
    parameters = parameter_count(w.model, w.seq_len, w.vocabulary)
    usable = (1 - assumed.headroom) * c.device_memory_gib
    fitting = [p for p in predictions if p.fits]
    lines = [
        f"# {w.model} ({parameters / 1e9:.2f} B parameters, {w.seq_len} tokens, "
        f"batch {w.global_batch}, {w.precision}, {w.optimizer}) on {c.nodes} x "
        f"{c.gpus_per_node} devices of {c.device_memory_gib:g} GiB, {c.peak_tflops:g} TFLOP/s",
        "",
        f"{len(fitting)} of {len(predictions)} configurations fit in {usable:.1f} GiB "
        f"({assumed.headroom:.0%} of each device's memory kept free).",
        "",
        "| # | configuration | runs as | GiB a rank | step (s) | tokens/sec | 95 % band | "
        + " | ".join(f"{t} (s)" for t in TERMS)
        + " |",
        "|" + "---|" * (7 + len(TERMS)),
    ]
    for rank, p in enumerate(fitting[:top], 1):
        lines.append(_row(rank, p))
    too_big = [p for p in predictions if not p.fits]
    if too_big:
        fastest = too_big[0]
        needs = sum(fastest.memory_bytes.values()) / GIB
        verb = "does" if len(too_big) == 1 else "do"
        lines += [
            "",
            f"{len(too_big)} {verb} not fit; the fastest of them, "
            f"{fastest.configuration.name}, needs {needs:.1f} GiB a rank.",
        ]
    lines += ["", "Assumed, not fitted (no record is read yet; each a flag):", ""]
    values = {
        **vars(assumed),
        "intra_gb_per_s": c.intra_gb_per_s,
        "inter_gb_per_s": c.inter_gb_per_s,
    }
    for name, text in ASSUMED.items():
        lines.append(f"- {text}: {values[name]:g} (--{name.replace('_', '-')})")
    lines += [
        "",
        "No 95 % band: every term above is assumed, none fitted to a measurement, so "
        "the spread of a fit cannot be shown.",
        "",
    ]
    return "\n".join(lines)


def _row(rank: int, p) -> str:
    runs_as = ", ".join(p.configuration.runs_as()) or "predicted only"
    memory = sum(p.memory_bytes.values()) / GIB
    terms = " | ".join(f"{p.seconds[t]:.3f}" for t in TERMS)
    return (
        f"| {rank} | {p.configuration.name} | {runs_as} | {memory:.1f} | "
        f"{p.step_seconds:.3f} | {p.tokens_per_sec:,.0f} | none: assumed | {terms} |"
    )


def write_csv(predictions: list, path: str) -> None:
    with open(path, "w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(
            [
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
                *[f"{t}_seconds" for t in TERMS],
            ]
        )
        for p in predictions:
            c = p.configuration
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
                    *[round(p.seconds[t], 6) for t in TERMS],
                ]
            )
