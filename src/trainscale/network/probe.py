"""`trainscale probe`: what the network between a study's ranks delivers,
measured through the ranks' own communication library (seed 002's NetPIPE
figure; nccl-tests' bus bandwidth), started as the study's training ranks are.

A transport is what a framework's ranks exchange gradients over; its launch
kind names it (LaunchKind.probe_transport), and the probe starts its ranks
with the launch kind of one framework that uses it, so they run on the same
nodes through the same launcher (srun under SLURM, the local plan here):

    torch         torch.distributed: gloo on CPUs, NCCL on GPUs (torch-ddp's ranks)
    horovod-mpi   Horovod's all-reduce over MPI (horovod-torch's ranks, mpirun/srun --mpi=pmix)
    horovod-gloo  the same over Gloo (horovodrun --gloo / srun and a rendezvous server)
    tf            TensorFlow's collective ops, as MultiWorkerMirroredStrategy runs
                  them: RING over gRPC on CPUs, NCCL on GPUs (TF_CONFIG / srun)

A probe of one
node and two ranks measures the node's own link; of two nodes and one rank
each, the network between them (LINKS). The ranks' sweeps are in
trainscale.network.probe_ranks; the record is one JSON file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from trainscale.catalogue.options import OPTION
from trainscale.catalogue.settings import SETTING, RunSettings, SettingsError, validate
from trainscale.core.records import atomic_write_json, host_provenance, utc_now
from trainscale.core.setting import add_argument

PROBE_SCHEMA = 1
# (nodes, ranks per node) of each link a probe measures: the node's own, the
# network; and a parameter server's incast across it (4 ranks: the server and
# a worker on node 1, two workers on node 2).
LINKS = {"intra-node": (1, 2), "inter-node": (2, 1), "incast": (2, 2)}


@dataclasses.dataclass(frozen=True)
class Transport:
    name: str
    framework: str  # whose launch kind starts the ranks and whose environment runs them
    settings: tuple = ()  # (name, value) pairs that select it (a launcher)


def _transports() -> dict[str, Transport]:
    """Each transport a launch kind can start, with the first framework in the
    registry that is started so and runs in the ecosystem the transport's
    ranks need (probe_ranks.RANKS: Horovod's are horovod.torch's)."""
    from trainscale.catalogue.registry import REGISTRY
    from trainscale.network.probe_ranks import RANKS

    found: dict[str, Transport] = {}
    for spec in REGISTRY:
        for name, settings in spec.launch.probe_launches().items():
            if RANKS[name].ecosystem == spec.ecosystem:
                found.setdefault(name, Transport(name, spec.name, tuple(settings.items())))
    return found


TRANSPORTS = _transports()


# The folder of the cluster's default route (network ""); no cluster network
# may take the name (the config schema refuses it).
DEFAULT_NETWORK = "default"
# A probe record's path below results/{study}/. The container level came with
# the container axis: a study's probes from before it are planned again.
PROBE_PATTERN = "network/{network}/{container}/{transport}/n{nodes}r{ranks_per_node}"


@dataclasses.dataclass(frozen=True, order=True)
class ProbeJob:
    network: str  # its folder name: DEFAULT_NETWORK for the cluster's default route
    container: str  # cluster.containers' name, or "none": the bare host
    transport: str
    nodes: int
    ranks_per_node: int

    def stem(self) -> str:
        return PROBE_PATTERN.format(**dataclasses.asdict(self))


def study_probes(config: dict, points) -> list[ProbeJob]:
    """The probes a study runs (config `probe`): each network and container of
    its grid x each transport its frameworks talk over x each link of
    `probe.links` that a run crosses (the node's own where a point has 2 GPUs
    per node, the network where one spans 2 nodes)."""
    from trainscale.catalogue.registry import FRAMEWORKS
    from trainscale.study.study import run_settings

    probe = config.get("probe", {})
    if not probe.get("enabled"):
        return []
    links = probe.get("links", ("intra-node", "inter-node"))
    runs = [run_settings(config, p) for p in points if p.framework in FRAMEWORKS]
    transports = sorted({transport_of(s) for s in runs} - {""})
    networks = sorted({s.network or DEFAULT_NETWORK for s in runs})
    containers = sorted({s.container for s in runs})
    # A link no run crosses is not probed: one node's own with one GPU, the network on one node.
    crossed = {
        "intra-node": max(s.gpus_per_node for s in runs) >= 2,
        "inter-node": max(s.nodes for s in runs) >= 2,
        "incast": max(s.nodes for s in runs) >= 2,
    }
    shapes = [LINKS[link] for link in LINKS if link in links and crossed[link]]
    return [
        ProbeJob(n, c, t, *shape)
        for n in networks
        for c in containers
        for t in transports
        for shape in shapes
    ]


def probe_point(config: dict, job: ProbeJob):
    """A grid point of the probe's shape, network and container, for its SLURM
    resources, environment and container command (trainscale.study.jobs)."""
    from trainscale.study.study import GridPoint

    spec, grid = TRANSPORTS[job.transport], config["grid"]
    knobs = [
        *spec.settings,
        *([("network", job.network)] if job.network != DEFAULT_NETWORK else []),
        *([("container", job.container)] if job.container != "none" else []),
    ]
    return GridPoint(
        spec.framework, grid["model"][0], grid["batch_size"][0], job.nodes, job.ranks_per_node,
        knobs=tuple(knobs),
    )  # fmt: skip


def transport_of(settings: RunSettings) -> str:
    """The transport a run's ranks talk over ("" if none is probed)."""
    from trainscale.catalogue.registry import framework_spec

    return framework_spec(settings.framework).launch.probe_transport(settings)


def probe_settings(transport: str, nodes: int, ranks_per_node: int, device: str, network: str):
    """The settings whose launch starts the probe's ranks (validated)."""
    spec = TRANSPORTS[transport]
    settings = RunSettings(
        framework=spec.framework,
        nodes=nodes,
        gpus_per_node=ranks_per_node,
        device=device,
        network=network,
        **dict(spec.settings),
    )
    return validate(settings, check_data=False)


def probe_parser(commands) -> None:
    p = commands.add_parser(
        "probe",
        help="latency and bandwidth between ranks: ping-pong and all-reduce sweeps",
        description="Starts the ranks as the transport's framework starts its training "
        "ranks (srun inside a SLURM job) and writes one JSON record to --output.",
    )
    p.add_argument("--transport", choices=sorted(TRANSPORTS), required=True)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--device", choices=SETTING["device"].choices, default="cpu")
    p.add_argument(
        "--network-name", dest="network", default="", help="the network's name, recorded (a label)"
    )
    p.add_argument(
        "--container-name", dest="container", default="none", help="the container's name, recorded"
    )
    add_argument(p, OPTION["container_command"])
    p.add_argument("--largest-message-bytes", type=int, default=2**28)
    p.add_argument("--repetitions", type=int, default=20)
    # As `trainscale run` declares them (trainscale.catalogue.settings): the job's request.
    add_argument(p, OPTION["requested_gpus_per_node"])
    add_argument(p, OPTION["requested_cpus_per_task"])
    p.add_argument("--timeout", type=float, default=0, help="stop after this long (0: none)")
    p.add_argument("--output", required=True)


def _ranks_command(args, partial: str) -> list[str]:
    """What each rank of the probe runs (trainscale.network.probe_ranks); rank
    0 writes its measurements to `partial`."""
    command = [sys.executable, "-m", "trainscale.network.probe_ranks"]
    command += ["--transport", args.transport]
    command += ["--largest-message-bytes", str(args.largest_message_bytes)]
    command += ["--repetitions", str(args.repetitions), "--device", args.device]
    command += ["--nodes", str(args.nodes), "--ranks-per-node", str(args.ranks_per_node)]
    return command + ["--output", partial]


def run_probe(args) -> int:
    """`trainscale probe`: the ranks started as the transport's frameworks
    start theirs, then the record; 0, or 1 where the ranks failed."""
    from trainscale.core.slurm import in_slurm_job
    from trainscale.launching.containers import container_provenance, prepare_container
    from trainscale.launching.launch import rank_plan, run_plan

    if args.largest_message_bytes < 4 or args.repetitions < 3:
        raise SettingsError("--largest-message-bytes must be at least 4, --repetitions at least 3")
    settings = probe_settings(
        args.transport, args.nodes, args.ranks_per_node, args.device, args.network
    )
    partial = f"{args.output}.rank0.json"
    command = _ranks_command(args, partial)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    prepare_container(args.container, args.container_command, in_slurm_job())
    container = container_provenance(args.container, args.container_command)
    started = utc_now()
    plan = rank_plan(
        settings,
        command,
        args.requested_gpus_per_node,
        args.requested_cpus_per_task,
        args.container_command,
    )
    result = run_plan(plan, args.timeout)
    if result.code != 0 or not os.path.exists(partial):
        why = "timed out" if result.timed_out else f"exit code {result.code}"
        print(f"trainscale probe: the ranks failed ({why})", file=sys.stderr)
        return 1
    with open(partial) as handle:
        measured = json.load(handle)
    record = {
        "kind": "network_probe",
        "schema": PROBE_SCHEMA,
        "network": args.network,
        "nodes": args.nodes,
        "ranks_per_node": args.ranks_per_node,
        "device": args.device,
        "repetitions": args.repetitions,
        "largest_message_bytes": args.largest_message_bytes,
        **measured,
        "started": started,
        "seconds": result.seconds,
        "provenance": host_provenance(),
        # The ranks' container (a label, and the runtime seen from outside).
        "container_name": args.container,
        **container,
    }
    atomic_write_json(args.output, record)
    os.remove(partial)
    print(json.dumps(summary(record)))
    return 0


def read_probes(paths: list[str]) -> list[dict]:
    """Probe records, by network, transport and nodes."""
    records = []
    for path in paths:
        with open(path) as handle:
            records.append(json.load(handle))
    return sorted(
        records, key=lambda r: (r["network"], probe_container(r), r["transport"], r["nodes"])
    )


def probe_container(record: dict) -> str:
    """The container a probe's ranks ran in ("none": the bare host, as every
    probe before the container axis)."""
    return record.get("container_name", "none")


def summary(record: dict) -> dict:
    """The probe's headline: a byte's one-way latency, the largest message's bandwidths."""
    ping, reduce = record["ping_pong"], record["all_reduce"]
    return {
        "transport": record["transport"],
        "link": record["link"],
        "latency_us": ping[0]["latency"] * 1e6 if ping else None,
        "ping_pong_gbit_per_s": ping[-1]["bandwidth"] * 8e-9 if ping else None,
        "all_reduce_busbw_gbit_per_s": reduce[-1]["busbw"] * 8e-9 if reduce else None,
    }
