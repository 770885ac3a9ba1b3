"""The launch kind of tf.distribute's parameter-server training
(trainscale.catalogue.launch_kinds has the seam): processes with roles, a chief
that drives the training loop, and parameter servers and workers that serve
until it ends.

Imports neither TensorFlow nor torch.
"""

from __future__ import annotations

import json

from trainscale.catalogue.launch_kinds import PROCESS_INDEX, LaunchKind, Plan, Process, Role
from trainscale.core.ports import free_ports
from trainscale.core.setting import Setting

PS_SERVERS = Setting(
    "ps_servers",
    int,
    1,
    "tf-ps: parameter servers, each a process of its own, that the variables are "
    "partitioned over",
    minimum=1,
    axis=True,
    group="launch",
)
# What a parameter server and a worker run: a tf.distribute.Server.
SERVE = "trainscale.frameworks.tensorflow.parameter_server:serve"
# gRPC's own retries would hide a lost server from the coordinator (TF's
# parameter-server tutorial sets this on every task).
FAIL_FAST = {"GRPC_FAIL_FAST": "use_caller"}


def parameter_server_roles(workers: int, servers: int) -> tuple[Role, ...]:
    """A chief that drives the loop and writes the record, then the parameter
    servers, then one worker per replica; the last two serve until it ends."""
    return (
        Role("chief", 1),
        Role("ps", servers, runs=SERVE, ends_by_itself=False),
        Role("worker", workers, runs=SERVE, ends_by_itself=False),
    )


class ParameterServers(LaunchKind):
    """tf.distribute's parameter-server training: processes with roles, each
    told the whole cluster and its own task in TF_CONFIG here, and under
    SLURM by SlurmClusterResolver from its SLURM_PROCID (one srun step; the
    roles fill the tasks in order, node by node)."""

    name = "parameter-server"
    settings = (PS_SERVERS,)
    one_node = (
        'TF_CONFIG=\'{{"cluster": {{"chief": ["localhost:2222"], "ps": '
        '["localhost:2223"], "worker": ["localhost:2224", ...]}}, '
        '"task": {{"type": T, "index": I}}}}\' python {script}   # each process'
    )
    two_nodes = "the same, with node1:PORT and node2:PORT addresses   # each process"

    def roles(self, settings) -> tuple[Role, ...]:
        return parameter_server_roles(settings.replicas, settings.ps_servers)

    def local_plan(self, processes: int, command: list[str], settings) -> Plan:
        roles = parameter_server_roles(processes, settings.ps_servers)
        ports = iter(free_ports(sum(role.count for role in roles)))
        cluster = {r.name: [f"localhost:{next(ports)}" for _ in range(r.count)] for r in roles}
        plan: Plan = []
        for role in roles:
            for task in range(role.count):
                tf_config = {"cluster": cluster, "task": {"type": role.name, "index": task}}
                env = {"TF_CONFIG": json.dumps(tf_config), PROCESS_INDEX: str(len(plan))}
                plan.append(Process(command, {**env, **FAIL_FAST}, role.ends_by_itself))
        return plan

    def slurm_step(self, settings) -> tuple[list[str], dict[str, str]]:
        # SlurmClusterResolver hands out the tasks node by node.
        return ["--distribution=block"], dict(FAIL_FAST)


PARAMETER_SERVERS = ParameterServers()
