"""ray-train: Ray Train's TorchTrainer running torch-ddp's training function.

`trainscale train --framework ray-train` is Ray's driver (`drive`): it starts
a private Ray instance for the run, then a TorchTrainer whose workers (one
per replica) each run trainscale.harness.training.train, the same function every
torch-ddp rank runs, with the same model, data shards, DDP step and timed
blocks. Ray Train has set up torch.distributed in each worker (gloo on CPUs,
NCCL on GPUs) and says each worker's rank (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE), so the backend only reads them. Rank 0 gathers every
worker's block times and writes the record, as torch-ddp's rank 0 does, so
any difference from torch-ddp is Ray's.

Fault tolerance is off unless --ray-max-failures says how often a lost
worker may restart the worker group (FailureConfig(max_failures)), with as
many workers as the cluster still has room for, --min-replicas at least
(ScalingConfig's worker range: Ray 2.60's elastic training). Then each
worker reports the training state through ray.train.report every
--checkpoint-blocks blocks, and a restarted worker goes on from
ray.train.get_checkpoint(), as Ray Train's fault-tolerance guide teaches.
Off, a lost worker ends the run, and `trainscale run` records it as failed.
What Ray costs before training (its cluster start, the worker group's start)
is start-up, kept apart from the timed blocks in the record's `ray` part.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from trainscale.catalogue.elastic_kinds import worker_range
from trainscale.catalogue.launch_kinds import LEAN_RAY, RAY
from trainscale.frameworks.torch.torch_backend import TorchBackend
from trainscale.frameworks.torch.torch_ddp import DistributedDataParallel
from trainscale.frameworks.torch.torch_elastic import ElasticDistributedDataParallel as Elastic

# Ray's sockets live below its temp folder, and a Unix socket path has at
# most 107 bytes: a run folder deeper than this is reached by a short link.
_RAY_TEMP_MAX = 40


class RayTrainDDP(DistributedDataParallel):
    """torch-ddp's backend in a Ray Train worker: the process group is Ray's;
    with --ray-max-failures, the state torch-elastic saves, kept by Ray."""

    @property
    def elastic(self) -> bool:
        return RAY.max_failures(self.settings) > 0

    def save_state(self, path: str, steps: int) -> None:
        from ray.train import Checkpoint, report

        folder = f"{path}.{steps}"  # one folder per report: Ray copies it to its storage
        chief = self.topology.is_chief
        if chief:
            os.makedirs(folder, exist_ok=True)
        # torch-elastic's state (every rank's random state too): the chief writes it.
        Elastic.save_state(self, os.path.join(folder, "state.pt"), steps)
        # Every worker reports (Ray Train V2 waits for all); the chief's checkpoint.
        report({"steps": steps}, checkpoint=Checkpoint.from_directory(folder) if chief else None)
        if chief:
            shutil.rmtree(folder, ignore_errors=True)

    def restore_state(self, path: str) -> int:
        from ray.train import get_checkpoint

        checkpoint = get_checkpoint()
        if checkpoint is None:
            return 0
        with checkpoint.as_directory() as folder:
            return Elastic.restore_state(self, os.path.join(folder, "state.pt"))

    def framework_config(self) -> dict:
        return {
            "max_failures": RAY.max_failures(self.settings),
            "num_workers": _workers(self.settings),
        }

    def connect(self) -> int:
        import torch.distributed as dist

        world = dist.get_world_size()
        self.topology.num_processes, self.topology.process_index = world, dist.get_rank()
        self.gradient_scale = float(world)  # DDP averages; see torch_backend
        return int(os.environ.get("LOCAL_WORLD_SIZE", world))

    def close(self) -> None:
        # Ray's worker group owns the process group and ends it: only the
        # batches close here (TorchBackend.close, not TorchDistributed's).
        TorchBackend.close(self)


def _worker(config: dict) -> None:
    """One Ray Train worker: trainscale's training function, as torch-ddp's ranks run it."""
    from trainscale.core.heap import pause_collection

    pause_collection()  # until the model is built, as in every rank (trainscale.core.heap)
    from trainscale.catalogue.options import RunOptions
    from trainscale.catalogue.settings import RunSettings
    from trainscale.core.supervision import mark_first_to_die
    from trainscale.harness.training import train

    mark_first_to_die()  # the kernel's first choice, as every rank of torch-ddp is
    train(RunSettings(**config["settings"]), RayTrainDDP, RunOptions(**config["options"]))


def _ray_folder(output: str, node_id: int) -> tuple[str, str | None]:
    """The run's own folder for Ray on this node (beside its record), and the
    short link to it that Ray is given when the path is too long for its sockets."""
    folder = os.path.abspath(os.path.splitext(output)[0] + f".ray{node_id}")
    os.makedirs(folder, exist_ok=True)
    if len(folder) <= _RAY_TEMP_MAX:
        return folder, None
    # The temp folder if its path is short (TMPDIR may be long), else /tmp.
    temp = tempfile.gettempdir()
    link = os.path.join(temp if len(temp) <= 16 else "/tmp", f"ts-ray-{os.getpid()}")
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(folder, link)
    return folder, link


def _trainer(settings, options, folder: str):
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    return TorchTrainer(
        _worker,
        train_loop_config={
            "settings": dataclasses.asdict(settings),
            "options": dataclasses.asdict(options),
        },
        torch_config=TorchConfig(
            backend="nccl" if settings.device == "gpu" else "gloo",
            timeout_s=int(options.collective_timeout or 1800),
        ),
        scaling_config=ScalingConfig(
            num_workers=_workers(settings), use_gpu=settings.device == "gpu"
        ),
        run_config=RunConfig(
            name="trainscale",
            storage_path=os.path.join(folder, "results"),
            failure_config=FailureConfig(max_failures=RAY.max_failures(settings)),
        ),
    )


def _workers(settings) -> int | tuple[int, int]:
    """ScalingConfig's num_workers: fault-tolerant, a range (Train V2's
    elastic scaling: a restart starts as many workers as the cluster's
    resources allow, --min-replicas at least); else the run's replicas."""
    fewest, most = worker_range(settings)
    return (fewest, most) if RAY.max_failures(settings) and fewest < most else most


def _head_address(head: str) -> str:
    """host:port as IP:port, resolved as the system does (/etc/hosts first).
    Ray's gRPC resolves names with its own DNS client (c-ares): in the SLURM
    lab, whose nodes are /etc/hosts names, a join at node1:port waited for the
    GCS until it timed out, at 10.99.0.11:port it joined (Ray 2.60). Ray's
    SLURM guide also hands the nodes the head's IP."""
    host, port = head.rsplit(":", 1)
    return f"{socket.gethostbyname(host)}:{port}"


def _start_node(settings, temp: str, head: str, is_head: bool) -> subprocess.Popen:
    """`ray start --block` for this SLURM node: the head (on the job's first
    node, at the job's own port) or a worker joining it. --block keeps Ray's
    processes its children, and it stops them on SIGTERM."""
    host, port = head.rsplit(":", 1)
    common = [
        "--block", f"--temp-dir={temp}", "--disable-usage-stats",
        # One CPU per replica the node runs, and no more: Ray packs workers
        # (PACK), and a spare CPU on the head would take a second node's worker.
        f"--num-cpus={settings.gpus_per_node}",
        f"--num-gpus={settings.gpus_per_node if settings.device == 'gpu' else 0}",
    ]  # fmt: skip
    if is_head:
        where = [f"--node-ip-address={host}", f"--port={port}"]
        command = ["start", "--head", *where, "--include-dashboard=false", *common]
    else:
        command = ["start", f"--address={head}", *common]
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    env = {
        **os.environ,
        # A worker node whose head is gone stops after 10 s, not Ray's 60.
        "RAY_gcs_rpc_server_reconnect_timeout_s": "10",
        # On SIGTERM Ray drains the node for 30 s (for Ray Serve's proxies)
        # before it stops: longer than SLURM's KillWait before its SIGKILL.
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    }
    return subprocess.Popen([ray, *command], env=env, stdout=sys.stderr)


def _wait_for_nodes(count: int, within: float = 300) -> None:
    import ray

    deadline = time.monotonic() + within
    while sum(node["Alive"] for node in ray.nodes()) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"Ray: {count} node(s) did not join within {within:.0f} s")
        time.sleep(1)


def _absolute_paths(settings, options):
    """Ray Train runs each worker in a folder of its own: every path absolute."""
    weights = options.save_weights and os.path.abspath(options.save_weights)
    options = dataclasses.replace(
        options, output=os.path.abspath(options.output), save_weights=weights
    )
    return dataclasses.replace(settings, data_dir=os.path.abspath(settings.data_dir)), options


def _token_auth() -> None:
    """Ray's token auth (on by default for a local instance) would keep its
    token in ~/.ray: given in the environment, no file is written. The mode
    is said too: without it a driver joining a running cluster sends no
    token (Ray 2.60: "Missing authorization header in request!")."""
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    os.environ["RAY_AUTH_MODE"] = "token"


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _wait_for_head(node: subprocess.Popen, head: str, within: float = 300) -> None:
    """Until the head's GCS port answers: a driver started first would spend
    ray.init's own short patience (about 20 s) on a head still starting."""
    host, port = head.rsplit(":", 1)
    deadline = time.monotonic() + within
    while True:
        if node.poll() is not None:
            raise RuntimeError(f"Ray's head exited with {node.returncode} before it served")
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError as error:
            if time.monotonic() > deadline:
                message = f"Ray's head at {head} did not serve within {within:.0f} s"
                raise RuntimeError(message) from error
            time.sleep(0.5)


def _start_local(ray, settings, temp: str) -> None:
    """A private local Ray instance of the run's replicas, its files in `temp`."""
    ray.init(
        num_cpus=settings.replicas,  # Train V2's controller asks none
        num_gpus=settings.replicas if settings.device == "gpu" else 0,
        include_dashboard=False,
        _temp_dir=temp,
        log_to_driver=True,
    )


def _stop_node(node) -> None:
    """This SLURM task's `ray start --block`, if it is still running."""
    if node is not None and node.poll() is None:
        node.terminate()
        node.wait(timeout=60)


def drive(settings, options) -> dict:
    """Start Ray, run the workers, stop Ray; returns the record's Ray part.

    Here: a private local instance (ray.init). Under SLURM (TRAINSCALE_RAY_HEAD,
    set by the launch kind's srun step): a head on the job's first node and a
    worker node on each other, each a `ray start --block` of this step's task,
    as Ray's SLURM guide starts them; the driver runs on the head's node.
    Raises the first worker's error (an OutOfMemory included) when the run fails.
    """
    started = time.perf_counter()
    settings, options = _absolute_paths(settings, options)
    head = os.environ.get("TRAINSCALE_RAY_HEAD")
    node_id = int(os.environ.get("SLURM_NODEID", 0)) if head else 0
    folder, link = _ray_folder(options.output, node_id)
    _token_auth()
    for name, value in LEAN_RAY.items():
        os.environ.setdefault(name, value)  # a user's own setting wins
    import ray  # after _token_auth: Ray reads its auth mode once, on import

    temp = os.path.join(link or folder, "tmp")
    node = None
    # srun ends a step's other tasks with SIGTERM when one fails: unwinding
    # through `finally` stops this node's Ray and removes its folder.
    previous_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        if head:
            head = _head_address(head)
            node = _start_node(settings, temp, head, is_head=node_id == 0)
            if node_id != 0:
                node.wait()  # until the head goes: the driver's run is over
                return {}
            _wait_for_head(node, head)
            ray.init(address=head)
            _wait_for_nodes(settings.nodes)
        else:
            _start_local(ray, settings, temp)
        cluster_started = time.perf_counter()
        _trainer(settings, options, folder).fit()
        finished = time.perf_counter()
    finally:
        ray.shutdown()
        _stop_node(node)
        if link:
            os.unlink(link)
        signal.signal(signal.SIGTERM, previous_handler)
        # Nothing of Ray's stays beside the record: its session holds JSON
        # files that a study's runs/ folder must not.
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "ray": {
            # The cluster up: ray.init's local instance, or every node joined.
            "cluster_start_seconds": cluster_started - started,
            # TorchTrainer.fit: the worker group's start, then the workers' runs.
            "fit_seconds": finished - cluster_started,
            "driver_seconds": time.perf_counter() - started,
            "ray_version": ray.__version__,
            "nodes": settings.nodes,
        }
    }
