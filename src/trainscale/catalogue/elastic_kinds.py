"""The launch kinds of elastic frameworks (trainscale.catalogue.launch_kinds has
the seam): each starts agents that survive a lost process, and a world that
may shrink to --min-replicas (trainscale.core.faults measures what it costs).

- TORCHRUN_ELASTIC: torchrun's elastic agents and a c10d rendezvous;
- HOROVOD_ELASTIC: horovodrun --gloo's elastic driver and a host discovery script.

Imports neither TensorFlow nor torch.
"""

from __future__ import annotations

import os

from trainscale.catalogue.launch_kinds import HOROVODRUN_GLOO, LaunchKind, Plan, Process
from trainscale.core import slurm
from trainscale.core.ports import free_ports
from trainscale.core.process_exit import temp_folder_until_exit
from trainscale.core.setting import Setting

# Set on each local elastic agent: the node it stands for (a node fault's).
AGENT_INDEX = "TRAINSCALE_AGENT"
# python -c AGENT_ONCE_STORE_SERVES HOST PORT TORCHRUN_ARGS...: a torchrun
# agent that joins once HOST:PORT (the first agent's store) takes
# connections, having imported torch meanwhile: started after the first
# agent's store, each agent's import (4 s of a core here) followed the first's.
AGENT_ONCE_STORE_SERVES = (
    "import socket, sys, time\n"
    "from torch.distributed.run import main\n"
    "while True:\n"
    "    try:\n"
    "        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()\n"
    "        break\n"
    "    except OSError:\n"
    "        time.sleep(0.1)\n"
    "main(sys.argv[3:])\n"
)

# torchrun's rendezvous defaults (a last call of 30 s, a node dead after 3
# missed 5 s heartbeats) would put 15-45 s of waiting into every recovery;
# these are a fast-failover configuration, and the record says which. The
# last call outlasts a dead node's 3 s: with a 1 s last call, a round closed
# with a lost agent still counted and waited 60 s for it (2 of 6 runs here).
ELASTIC_RENDEZVOUS = "last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=3"
# torch 2.13's agents share their rendezvous store with their ranks across
# restarts, and a restarted rank read the last round's gloo addresses: its
# init_process_group waited out gloo's 100 s connect timeout (3 of 6 runs
# with a killed rank here); with a store per round, 0 of 8.
OWN_STORE_PER_ROUND = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
ELASTIC_MAX_RESTARTS = 3
MIN_REPLICAS = Setting(
    "min_replicas",
    int,
    1,
    "elastic frameworks: the fewest replicas the run goes on with after losing some",
    minimum=1,
    group="faults",
    metavar="N",
    check=lambda s: f"--min-replicas {s.min_replicas} is above the run's {s.replicas} replicas"
    if s.min_replicas > s.replicas
    else "",
)


def worker_range(settings) -> tuple[int, int]:
    """The fewest and the most replicas an elastic run trains with."""
    return settings.min_replicas, settings.replicas


def world_size_error(settings, ranks: int, elastic: bool) -> str:
    """'' where `ranks` is a world the run may have (an elastic one may have
    shrunk to --min-replicas), else the one-line refusal."""
    fewest, most = worker_range(settings) if elastic else (settings.replicas,) * 2
    if fewest <= ranks <= most:
        return ""
    return (
        f"{settings.framework} was launched with {ranks} ranks but the run asks for "
        f"{settings.replicas} ({settings.nodes} nodes x {settings.gpus_per_node} per node)"
        + (f", at least {settings.min_replicas} (--min-replicas)" if elastic else "")
    )


# The ranks on this machine, set on each by a local plan whose launcher's
# local size counts fewer: Horovod elastic's counts one of the machine's two
# names, torchrun's one agent's. Without it, each of 2 CPU ranks took both
# cores' threads: 2 Horovod ranks trained 94 img/s where 1 trained 2735
# (bench/README.md).
MACHINE_PROCESSES = "TRAINSCALE_MACHINE_PROCESSES"


def processes_on_machine(local_size: int) -> int:
    """The processes sharing this machine: what the launcher's local size
    says, unless the elastic launch kind's local plan said more."""
    return int(os.environ.get(MACHINE_PROCESSES, local_size))


class TorchElastic(LaunchKind):
    """torchrun's elastic agents (torch.distributed.run): each agent starts
    its node's ranks, and on a failure every agent stops its ranks and joins a
    new c10d rendezvous; the world is whatever joined, between the run's
    --min-replicas and its replicas. Here one agent per replica, so that a
    lost agent is a lost node: the first agent holds the rendezvous's store
    (c10d's), so the run needs it and may lose any other. Under SLURM one
    agent per node, in one srun step that outlives a lost node."""

    name = "torchrun-elastic"
    settings = (MIN_REPLICAS,)

    def job_options(self, settings) -> tuple[str, ...]:
        # SLURM ends a job whose node fails unless it was submitted --no-kill:
        # the agents on the other nodes would go with it.
        return ("--no-kill",)

    ranks_in_task_order = False  # the rendezvous ranks the agents as they join
    one_node = (
        "torchrun --nnodes=1:4 --nproc-per-node=1 --rdzv-backend=c10d "
        "--rdzv-endpoint=localhost:29500 --max-restarts=3 {script}   # 4 times: one agent per GPU"
    )
    two_nodes = (
        "torchrun --nnodes=1:2 --nproc-per-node=4 --rdzv-backend=c10d "
        "--rdzv-endpoint=node1:29500 --max-restarts=3 {script}   # on each node"
    )

    def probe_transport(self, settings) -> str:
        return "torch"

    def probe_launches(self) -> dict[str, dict]:
        return {"torch": {}}

    def agent(
        self, command, settings, agents: int, per_agent: int, endpoint: str, run_id: str, logs=()
    ):
        """One torchrun agent's argv, starting `command` (python -m trainscale
        ...); `logs`: its --log-dir option, if any."""
        minimum = -(-settings.min_replicas // per_agent)  # agents whose ranks make the minimum
        return [
            command[0],
            "-m",
            "torch.distributed.run",
            f"--nnodes={minimum}:{agents}",
            f"--nproc-per-node={per_agent}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={run_id}",
            f"--rdzv-conf={ELASTIC_RENDEZVOUS}",
            f"--max-restarts={ELASTIC_MAX_RESTARTS}",
            *logs,
            *command[1:],
        ]

    def local_plan(self, processes: int, command: list[str], settings) -> Plan:
        port = free_ports(1)[0]
        endpoint = f"127.0.0.1:{port}"
        # Without --log-dir each agent makes a folder for its ranks' error
        # files in the temp folder (torchelastic_*), and none removes it: one
        # per agent per run. This one is the launcher's, which outlives them.
        logs = ("--log-dir", temp_folder_until_exit("trainscale-torchrun-"))
        argv = self.agent(command, settings, processes, 1, endpoint, f"local{port}", logs)
        # Each agent's LOCAL_WORLD_SIZE is 1: without the machine's count each
        # CPU rank took every core's threads, trained a fifth as fast, and
        # ended at another loss than torch-ddp's (bench/README.md).
        machine = {MACHINE_PROCESSES: str(processes)}
        plan = [Process(argv, {AGENT_INDEX: "0", **OWN_STORE_PER_ROUND, **machine})]
        # The first agent binds the rendezvous's store (c10d: the first agent
        # whose host is the endpoint's, so here a race); the others start once
        # it serves, so the run needs only it, and a node fault on any other
        # agent is survivable.
        waiting = [command[0], "-c", AGENT_ONCE_STORE_SERVES, "127.0.0.1", str(port)]
        torchrun_args = argv[argv.index("torch.distributed.run") + 1 :]
        for index in range(1, processes):
            env = {AGENT_INDEX: str(index), **OWN_STORE_PER_ROUND, **machine}
            plan.append(Process([*waiting, *torchrun_args], env, required=False))
        return plan

    def slurm_plan(
        self, settings, train_command: list[str], requested_gpus: int, cpus_per_task: int = 0
    ) -> Plan:
        srun = slurm.srun_command(settings.nodes, 1, requested_gpus, cpus_per_task)
        # A lost node must not end the step: the agents left go on without it.
        srun = [option for option in srun if not option.startswith("--kill-on-bad-exit")]
        srun += ["--kill-on-bad-exit=0", "--no-kill"]
        if cpus_per_task:  # the agent's ranks share its task's CPUs
            srun[srun.index(f"--cpus-per-task={cpus_per_task}")] = (
                f"--cpus-per-task={cpus_per_task * settings.gpus_per_node}"
            )
        job = os.environ["SLURM_JOB_ID"]
        endpoint = f"{slurm.job_hosts()[0]}:{slurm.slurm_port_base(job)}"
        argv = self.agent(
            train_command, settings, settings.nodes, settings.gpus_per_node, endpoint, job
        )
        return [Process([*srun, *argv], dict(OWN_STORE_PER_ROUND))]


# Horovod elastic on one machine: the host under two names (Horovod's own
# integration tests do so), since a failed rank's host is blacklisted: the
# ranks on the other name go on. Each name is a node of a node fault.
HOROVOD_LOCAL_HOSTS = ("localhost", "127.0.0.1")


class HorovodElastic(LaunchKind):
    """horovodrun --gloo's elastic driver: it starts the ranks on the hosts a
    discovery script lists, and on a failure blacklists the failed rank's host
    and tells the others to reset: they restore their last commit in memory
    and go on, between --min-replicas and the run's replicas."""

    name = "horovod-elastic"
    settings = (MIN_REPLICAS,)
    one_node = (
        "horovodrun -np 4 --min-np 1 --max-np 4 --host-discovery-script ./discover_hosts.sh "
        "python {script}"
    )
    two_nodes = (
        "horovodrun -np 8 --min-np 4 --max-np 8 --host-discovery-script ./discover_hosts.sh "
        "python {script}   # discover_hosts.sh prints node1:4 and node2:4"
    )
    ranks_in_task_order = False

    def probe_transport(self, settings) -> str:
        return "horovod-gloo"

    def probe_launches(self) -> dict[str, dict]:
        return {"horovod-gloo": {"horovod_launcher": "gloo"}}

    def local_plan(self, processes: int, command: list[str], settings) -> Plan:
        # Ranks split over the host's two names, the first taking any odd one.
        slots = (processes - processes // 2, processes // 2)
        lines = [f"echo {host}:{n}" for host, n in zip(HOROVOD_LOCAL_HOSTS, slots) if n]
        # horovodrun reads it as long as its driver runs, which the process
        # that made this plan outlives (the launcher waits for its plan).
        script = os.path.join(temp_folder_until_exit("trainscale-hosts-"), "discover_hosts.sh")
        with open(script, "w") as out:
            out.write("#!/bin/sh\n" + "\n".join(lines) + "\n")
        os.chmod(script, 0o755)
        launch = [*HOROVODRUN_GLOO, "-np", str(processes)]
        launch += ["--min-np", str(settings.min_replicas), "--max-np", str(processes)]
        launch += ["--host-discovery-script", script, "--elastic-timeout", "60"]
        # Both names are this machine's loopback. Without the interface given,
        # Horovod 0.28.1's elastic driver resolves it by comparing two hosts,
        # and a run of one replica (one host) timed out after 60 s.
        launch += ["--network-interface", "lo"]
        return [Process([*launch, *command], {MACHINE_PROCESSES: str(processes)})]

    def slurm_plan(
        self, settings, train_command: list[str], requested_gpus: int, cpus_per_task: int = 0
    ) -> Plan:
        # One node (the registry's one_node): horovodrun starts the ranks of
        # another host over ssh, which a SLURM job's nodes need not allow. Its
        # driver runs as the step's one task, holding the node's CPUs.
        cpus = cpus_per_task * settings.gpus_per_node
        srun = slurm.srun_command(1, 1, requested_gpus, cpus)
        [local] = self.local_plan(settings.gpus_per_node, train_command, settings)
        return [Process([*srun, *local.argv], local.env)]


TORCHRUN_ELASTIC = TorchElastic()
HOROVOD_ELASTIC = HorovodElastic()
