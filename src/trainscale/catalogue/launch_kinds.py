"""How a framework's processes are started: each launch kind is one object.

A launch kind says, in one place, how many processes a node runs, the local
processes `trainscale run` starts on this machine (the plan: argv and extra
environment per process), the srun step inside a SLURM job, and the commands
a user types to start the framework's example script. The registry gives each
framework one (FrameworkSpec.launch); the launcher, the SLURM plan, the job
shapes and the examples ask it, and nothing switches on its name.

- ONE_PROCESS: one process drives all of the node's replicas (one device, or
  MirroredStrategy's devices);
- HOROVOD: one rank per replica, from mpirun or horovodrun --gloo here, srun
  under SLURM (--mpi=pmix, or a Gloo rendezvous server);
- MULTIWORKER: one TF_CONFIG worker per node holding its GPUs, one per
  replica on CPU (a worker holding two logical CPU replicas hung before its
  first step); SlurmClusterResolver under SLURM;
- PARAMETER_SERVERS: processes with roles (Role): a chief that drives the
  training loop, parameter servers and workers that serve until it ends
  (trainscale.catalogue.parameter_server_kind);
- elastic kinds, whose agents survive a lost process: trainscale.catalogue.elastic_kinds;
- TorchDistributed (TORCHRUN, DEEPSPEED): one rank per replica, each told
  RANK, WORLD_SIZE, LOCAL_RANK and the first rank's MASTER_ADDR:MASTER_PORT,
  what torch.distributed's env:// rendezvous reads; under SLURM each rank
  derives them from its task variables. The commands a user types are the
  object's (torchrun's; DeepSpeed's launcher), so a framework with a launcher
  of its own is another object of the class.

Imports neither TensorFlow nor torch.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from typing import List, NamedTuple

from trainscale.core import slurm
from trainscale.core.ports import free_ports
from trainscale.core.setting import Setting, SettingsError


class Process(NamedTuple):
    """One process a launcher starts: its argv and extra environment, whether
    it ends by itself (a parameter server serves until it is ended:
    trainscale.launching.launch.run_plan ends it once every process that does
    end by itself has ended), and whether the run needs it (an elastic
    framework's other agents may be lost: the run goes on without them)."""

    argv: list[str]
    env: dict[str, str]
    ends_by_itself: bool = True
    required: bool = True


Plan = List[Process]


@dataclass(frozen=True)
class Role:
    """One kind of process of a run, with its count in the whole job. A
    launch kind's processes are its roles' processes, in the order of its
    roles (task order: SLURM_PROCID under srun, TRAINSCALE_PROCESS here)."""

    name: str  # as TF_CONFIG's task type names it, or "rank"
    count: int
    # What it runs: "" the training loop (trainscale.harness.training), else
    # "module:function" that `trainscale train` runs in its place. The first
    # process of the role that runs the loop writes the record (rank 0; tf-ps's
    # chief), so which role writes it needs no field of its own.
    runs: str = ""
    ends_by_itself: bool = True


# Set on each local process of a plan with roles: its place in task order.
PROCESS_INDEX = "TRAINSCALE_PROCESS"


class LaunchKind:
    name = ""
    # The settings only this launch kind reads; their readers are the
    # frameworks it launches (trainscale.catalogue.registry.readers).
    settings: tuple[Setting, ...] = ()
    # What a user types on one node of 4 GPUs and on two such nodes, with
    # {script} for the example ("" where the framework spans no nodes).
    one_node = "python {script}"
    two_nodes = ""
    # Which host runs which rank: srun's task order (node by node), unless
    # the framework's own scheduler places its workers (Ray).
    ranks_in_task_order = True

    def job_options(self, settings) -> tuple[str, ...]:
        """sbatch options the job needs beyond its shape (slurm_extra)."""
        return ()

    def probe_transport(self, settings) -> str:
        """The communication library this kind's ranks exchange gradients over,
        as trainscale.network.probe names it ("": none it probes, or not across ranks)."""
        return ""

    def probe_launches(self) -> dict[str, dict]:
        """The transports a probe's ranks can be started as by this kind, each
        with the settings that select it (trainscale.network.probe.TRANSPORTS)."""
        return {}

    def processes_per_node(self, gpus_per_node: int, device: str) -> int:
        """How many OS processes one node runs for G GPUs (replicas) per node
        (a kind with roles: how many replicas' processes)."""
        return gpus_per_node

    def roles(self, settings) -> tuple[Role, ...]:
        """The run's processes, role by role: one role of identical ranks,
        the first of which writes the record, unless the kind has roles."""
        per_node = self.processes_per_node(settings.gpus_per_node, settings.device)
        return (Role("rank", settings.nodes * per_node),)

    def process_count(self, settings) -> int:
        """How many OS processes the run starts, every role's."""
        return sum(role.count for role in self.roles(settings))

    def tasks_per_node(self, settings) -> int:
        """The most processes one node runs (SLURM's --ntasks-per-node): the
        job's processes spread evenly, the first nodes taking any remainder."""
        return -(-self.process_count(settings) // settings.nodes)

    def role_of(self, settings, index: int) -> tuple[Role, int]:
        """The role of the process at `index` in task order, and its index
        among that role's processes."""
        for role in self.roles(settings):
            if index < role.count:
                return role, index
            index -= role.count
        raise IndexError(f"process {index} is beyond the run's {self.roles(settings)}")

    def local_plan(self, processes: int, command: list[str], settings) -> Plan:
        """The local processes running `command` as `processes` ranks here;
        `settings` has the attributes of the settings this kind reads."""
        return [Process(command, {})]

    def slurm_step(self, settings) -> tuple[list[str], dict[str, str]]:
        """What this kind adds to the grid point's srun step: options and environment."""
        return [], {}

    def slurm_plan(
        self, settings, train_command: list[str], requested_gpus: int, cpus_per_task: int = 0
    ) -> Plan:
        """The srun step of a grid point inside its SLURM job (trainscale.core.slurm)."""
        srun = slurm.srun_command(
            settings.nodes,
            self.tasks_per_node(settings),
            requested_gpus,
            cpus_per_task,
            self.process_count(settings),
        )
        options, env = self.slurm_step(settings)
        return [Process([*srun, *options, *train_command], env)]

    def example_arguments(self, replicas: int, device: str) -> list[str]:
        """What an example is told of its replicas beyond its processes: a
        one-process framework mirrors N CPU replicas only when told."""
        if device == "cpu" and self.processes_per_node(replicas, device) == 1 and replicas > 1:
            return ["--cpu-replicas", str(replicas)]
        return []

    def user_commands(self, script: str) -> tuple[str, str]:
        return self.one_node.format(script=script), self.two_nodes.format(script=script)


class OneProcess(LaunchKind):
    name = "single"

    def processes_per_node(self, gpus_per_node: int, device: str) -> int:
        return 1


HOROVOD_LAUNCHER = Setting(
    "horovod_launcher",
    str,
    "mpi",
    "how Horovod ranks are started: mpi (mpirun here, srun --mpi=pmix under SLURM) "
    "or gloo (horovodrun --gloo here, srun and a rendezvous server under SLURM)",
    choices=("mpi", "gloo"),
    group="launch",
)


class HorovodRanks(LaunchKind):
    name = "horovod"
    settings = (HOROVOD_LAUNCHER,)
    one_node = "horovodrun -np 4 python {script}"
    two_nodes = "horovodrun -np 8 -H node1:4,node2:4 python {script}"

    def local_plan(self, processes: int, command: list[str], settings) -> Plan:
        launcher, device = settings.horovod_launcher, settings.device
        return [
            Process(horovod_command(processes, launcher, command, device), mpirun_env(launcher))
        ]

    def probe_transport(self, settings) -> str:
        return f"horovod-{settings.horovod_launcher}"

    def probe_launches(self) -> dict[str, dict]:
        return {f"horovod-{v}": {"horovod_launcher": v} for v in HOROVOD_LAUNCHER.choices}

    def slurm_step(self, settings) -> tuple[list[str], dict[str, str]]:
        if settings.horovod_launcher == "mpi":
            # Debian's Open MPI can be started by srun only through PMIx.
            # On the CPU, ranks yield while they wait, as under mpirun
            # (horovod_command): a rank whose peer's node died otherwise
            # polls a core until SLURM ends the job.
            yielding = {"OMPI_MCA_mpi_yield_when_idle": "1"} if settings.device == "cpu" else {}
            return ["--mpi=pmix"], yielding
        per_node = self.processes_per_node(settings.gpus_per_node, settings.device)
        return [], slurm.start_gloo_rendezvous(settings.nodes, per_node)


def mpirun_env(launcher: str) -> dict[str, str]:
    """mpirun's own variables on one machine. Its PMIx server authenticates
    local clients by the first security plugin that answers: munge's, where
    the munge package is installed (SLURM's, or the lab's), retries a munged
    that is not running for 2.3 s before it falls back, on every launch.
    The kernel's own check of the client's user id ("native") is what
    one machine needs; a user's own choice of plugin stands."""
    if launcher != "mpi" or "PMIX_MCA_psec" in os.environ:
        return {}
    return {"PMIX_MCA_psec": "native"}


# horovodrun --gloo, less its launch-time import of TensorFlow (launching.horovodrun).
HOROVODRUN_GLOO = [sys.executable, "-m", "trainscale.launching.horovodrun", "--gloo"]


def horovod_command(
    ranks: int, launcher: str, command: list[str], device: str = "gpu"
) -> list[str]:
    """`command` as `ranks` local Horovod ranks, started by mpirun or horovodrun --gloo."""
    if launcher == "gloo":
        hosts = f"localhost:{ranks}"
        return [*HOROVODRUN_GLOO, "-np", str(ranks), "-H", hosts, *command]
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise SettingsError("--horovod-launcher mpi: no mpirun on PATH (install openmpi-bin)")
    mpirun_command = [mpirun, "-np", str(ranks), "--bind-to", "none", "--map-by", "slot"]
    mpirun_command.append("--oversubscribe")
    if os.geteuid() == 0:
        mpirun_command.append("--allow-run-as-root")
    # Containers often forbid the cross-memory-attach syscalls Open MPI's
    # shared-memory transport tries first; falling back costs nothing here.
    mpirun_command += ["--mca", "btl_vader_single_copy_mechanism", "none"]
    if device == "cpu":
        # A CPU rank's own threads fill its share of the cores, and Open MPI's
        # default busy polling takes one from them while the rank waits in a
        # collective: on a 2-core VM, 2 ranks of small_cnn trained 3.8-4.2k
        # img/s polling and 4.7-6.1k yielding (bench/README.md).
        mpirun_command += ["--mca", "mpi_yield_when_idle", "1"]
    return mpirun_command + command


class MultiWorker(LaunchKind):
    name = "multiworker"
    two_nodes = (
        'TF_CONFIG=\'{{"cluster": {{"worker": ["node1:12345", "node2:12345"]}}, '
        '"task": {{"type": "worker", "index": I}}}}\' python {script}   # on node I+1'
    )

    def processes_per_node(self, gpus_per_node: int, device: str) -> int:
        return gpus_per_node if device == "cpu" else 1

    def probe_transport(self, settings) -> str:
        return "tf"

    def probe_launches(self) -> dict[str, dict]:
        return {"tf": {}}

    def local_plan(self, processes: int, command: list[str], settings) -> Plan:
        addresses = [f"localhost:{port}" for port in free_ports(processes)]
        plan = []
        for index in range(processes):
            task = {"type": "worker", "index": index}
            tf_config = {"cluster": {"worker": addresses}, "task": task}
            plan.append(Process(command, {"TF_CONFIG": json.dumps(tf_config)}))
        return plan


class TorchDistributed(LaunchKind):
    name = "torch-distributed"

    def __init__(self, one_node: str, two_nodes: str):
        self.one_node, self.two_nodes = one_node, two_nodes

    def probe_transport(self, settings) -> str:
        return "torch"

    def probe_launches(self) -> dict[str, dict]:
        return {"torch": {}}

    def local_plan(self, processes: int, command: list[str], settings) -> Plan:
        port = free_ports(1)[0]
        ranks = {"WORLD_SIZE": str(processes), "LOCAL_WORLD_SIZE": str(processes)}
        ranks.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        return [
            Process(command, {**ranks, "RANK": str(rank), "LOCAL_RANK": str(rank)})
            for rank in range(processes)
        ]

    def slurm_step(self, settings) -> tuple[list[str], dict[str, str]]:
        return [], slurm.torch_rendezvous()


# Ray Train 2.60's print patch sends each worker's print to the driver twice
# (the patched print and the worker's output stream): one copy is enough.
QUIET_RAY = {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}

# What Ray starts for features a run does not use, off: the driver's
# environment reaches `ray start`, the raylet and every actor it starts
# (the harness's driver and an example's alike; bench/README.md, Ray).
LEAN_RAY = {
    # Idle workers started ahead for tasks: Train's controller and workers
    # are actors with an environment of their own, which start their own.
    "RAY_enable_worker_prestart": "0",
    "RAY_prestart_worker_first_driver": "0",
    # A poller for nodes a cloud autoscaler drains (spot preemption).
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    # Ray's own metrics export: the record holds trainscale's measurements.
    "RAY_TRAIN_METRICS_ENABLED": "0",
    "RAY_enable_metrics_collection": "0",
}


class RayDriver(OneProcess):
    """One process here, Ray's driver: it starts a private Ray instance and
    Ray starts the workers, one per replica, as its own children
    (trainscale.frameworks.torch.ray_train), so stopping the driver's process
    tree stops them all."""

    name = "ray"
    one_node = "python {script}   # Ray starts a local instance"
    ranks_in_task_order = False  # Ray Train orders its workers itself

    def probe_transport(self, settings) -> str:
        return "torch"  # Ray Train's workers form a torch.distributed group

    def example_arguments(self, replicas: int, device: str) -> list[str]:
        return ["--workers", str(replicas)]  # Ray starts them, on CPUs or GPUs

    def local_plan(self, processes: int, command: list[str], settings) -> Plan:
        lean = {name: os.environ.get(name, value) for name, value in LEAN_RAY.items()}
        return [Process(command, {**lean, **QUIET_RAY})]  # a user's own setting wins

    @staticmethod
    def max_failures(settings) -> int:
        """How often Ray may restart the worker group (ray-train's knob)."""
        return settings.ray_max_failures

    def job_options(self, settings) -> tuple[str, ...]:
        # With --ray-max-failures, Ray restarts its workers on the nodes left:
        # SLURM must not end the job, nor srun the step, when one fails.
        return ("--no-kill",) if self.max_failures(settings) else ()

    def slurm_step(self, settings) -> tuple[list[str], dict[str, str]]:
        # One task per node (processes_per_node): each starts its node's Ray,
        # the first the head, at a port of this job's own (slurm_port_base + 1:
        # torch's rendezvous takes the base); one token for the whole cluster.
        import secrets

        port = slurm.slurm_port_base(os.environ["SLURM_JOB_ID"]) + 1
        head = f"{slurm.job_hosts()[0]}:{port}"
        token = secrets.token_hex(32)
        # (After srun's own --kill-on-bad-exit=1: the last one counts.)
        survive = ["--kill-on-bad-exit=0", "--no-kill"] if self.max_failures(settings) else []
        return survive, {"TRAINSCALE_RAY_HEAD": head, "RAY_AUTH_TOKEN": token, **QUIET_RAY}

    two_nodes = (
        "ray start --head --port=6379 (node1); ray start --address=node1:6379 "
        "(node2); python {script} (node1)"
    )


def process_index() -> int:
    """This process's place in its run's task order: a local plan's, or its srun step's."""
    return int(os.environ.get(PROCESS_INDEX) or os.environ.get("SLURM_PROCID") or 0)


ONE_PROCESS = OneProcess()
RAY = RayDriver()
HOROVOD = HorovodRanks()
MULTIWORKER = MultiWorker()
TORCHRUN = TorchDistributed(
    "torchrun --nproc-per-node=4 {script}",
    "torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d "
    "--rdzv-endpoint=node1:29500 {script}   # on each node",
)
# DeepSpeed's own launcher (pdsh across the hostfile's nodes); the ranks it
# starts read the same variables as torchrun's.
DEEPSPEED = TorchDistributed(
    "deepspeed --num_gpus=4 {script}",
    "deepspeed --hostfile=hostfile {script}   # hostfile: node1 slots=4, node2 slots=4",
)
