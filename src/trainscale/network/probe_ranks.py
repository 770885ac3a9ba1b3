"""One rank of a network probe: the sweeps, over the ranks' own library.

`trainscale probe` starts these processes as its transport's framework
starts its training ranks (trainscale.network.probe); each runs

    python -m trainscale.network.probe_ranks --transport T --largest-message-bytes B
        --repetitions R --device D --output FILE

and rank 0 writes FILE. What is timed (trainscale.network.bandwidth has the arithmetic):
- ping-pong, rank 0 with the last rank (on another node when the probe spans
  two), over NetPIPE's sizes: torch.distributed's send/recv. Horovod and
  tf.distribute have no point-to-point operation, so their probes have none.
- all-reduce (sum, float32) over powers of two from 4 bytes, every rank; a
  repetition's time is the slowest rank's (the collective is done when the
  last rank is), each preceded by a barrier so no rank starts early.
- incast (torch.distributed only, 3 ranks or more): rank 0 plays a parameter
  server: every other rank sends it a message and it sends each one back
  (many-to-one, then one-to-many), timed on rank 0, over the all-reduce's
  sizes.
"""

from __future__ import annotations

import argparse
import os
import socket
import time

from trainscale.core.isolation import image_label, isolation_facts
from trainscale.network.bandwidth import (
    collective_bandwidths,
    incast_bandwidth,
    message_sizes,
    ping_pong,
)

# What selects the interface each library uses: kept in the probe's record.
INTERFACE_VARIABLES = (
    "NCCL_SOCKET_IFNAME",
    "NCCL_IB_DISABLE",
    "GLOO_SOCKET_IFNAME",
    "OMPI_MCA_btl_tcp_if_include",
    "OMPI_MCA_oob_tcp_if_include",
    "HOROVOD_GLOO_IFACE",
)


def collective_sizes(largest: int) -> list[int]:
    """All-reduce sizes: powers of two from one float32 to `largest` (nccl-tests' sweep)."""
    return [size for size in message_sizes(largest, perturbation=0) if size >= 4]


class TorchRanks:
    """torch.distributed: gloo on CPUs, NCCL on GPUs (DDP, FSDP2, DeepSpeed, Ray Train)."""

    ecosystem = "torch"  # the environment the ranks run in (registry.FrameworkSpec.ecosystem)
    has_point_to_point = True
    # gloo's threads can abort the interpreter's teardown after the group is
    # destroyed (trainscale.frameworks.torch.torch_distributed.TorchDistributed): end with os._exit.
    finalizes_at_exit = False

    def __init__(self, device: str, nodes: int, ranks_per_node: int):
        import torch
        import torch.distributed as dist

        from trainscale.core.slurm import rank_env_from_slurm

        if os.environ.get("TRAINSCALE_TORCH_FROM_SLURM"):
            os.environ.update(rank_env_from_slurm())
        self.torch, self.dist = torch, dist
        dist.init_process_group("nccl" if device == "gpu" else "gloo")
        self.backend = dist.get_backend()
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        if device == "gpu":
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")

    def buffer(self, size: int, dtype=None):
        return self.torch.zeros(size, dtype=dtype or self.torch.uint8, device=self.device)

    def wait(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def ping_pong(self, size: int, repetitions: int) -> list[float]:
        """Round trips of `size` bytes, rank 0 <-> the last rank (timed on rank 0)."""
        peer, message, times = self.size - 1, self.buffer(size), []
        for _ in range(repetitions):
            self.dist.barrier()
            if self.rank == 0:
                start = time.perf_counter()
                self.dist.send(message, peer)
                self.dist.recv(message, peer)
                self.wait()
                times.append(time.perf_counter() - start)
            elif self.rank == peer:
                self.dist.recv(message, 0)
                self.dist.send(message, 0)
        return times

    def incast(self, size: int, repetitions: int) -> list[float]:
        """Every other rank sends `size` bytes to rank 0, which sends `size`
        bytes back to each: a parameter server's step (timed on rank 0)."""
        message, times = self.buffer(size), []
        others = range(1, self.size)
        for _ in range(repetitions):
            self.dist.barrier()
            start = time.perf_counter()
            if self.rank == 0:
                received = [self.buffer(size) for _ in others]
                for work in [self.dist.irecv(b, peer) for b, peer in zip(received, others)]:
                    work.wait()
                for work in [self.dist.isend(message, peer) for peer in others]:
                    work.wait()
                self.wait()
                times.append(time.perf_counter() - start)
            else:
                self.dist.send(message, 0)
                self.dist.recv(message, 0)
        return times

    def all_reduce(self, size: int, repetitions: int) -> list[float]:
        """Each repetition's time on the slowest rank."""
        buffer, times = self.buffer(size // 4, self.torch.float32), []
        for _ in range(repetitions):
            self.dist.barrier()
            start = time.perf_counter()
            self.dist.all_reduce(buffer)
            self.wait()
            times.append(time.perf_counter() - start)
        slowest = self.torch.tensor(times, dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(slowest, op=self.dist.ReduceOp.MAX)
        return slowest.cpu().tolist()

    def hosts(self) -> list[str]:
        hosts = [None] * self.size
        self.dist.all_gather_object(hosts, socket.gethostname())
        return hosts

    def close(self) -> None:
        self.dist.destroy_process_group()


class HorovodRanks:
    """Horovod's all-reduce, over its MPI or Gloo controller (horovod.torch:
    the same C++ core and operations TensorFlow's Horovod uses)."""

    ecosystem = "torch"
    has_point_to_point = False
    finalizes_at_exit = True  # Horovod shuts down in an atexit hook

    def __init__(self, device: str, nodes: int, ranks_per_node: int):
        import horovod.torch as hvd
        import torch

        from trainscale.core.horovod_ranks import require_gloo
        from trainscale.core.slurm import horovod_env_from_slurm

        if os.environ.get("TRAINSCALE_HOROVOD_GLOO_FROM_SLURM"):
            os.environ.update(horovod_env_from_slurm())
        require_gloo(hvd)
        hvd.init()
        self.hvd, self.torch = hvd, torch
        self.backend = "mpi" if hvd.mpi_enabled() else "gloo"
        self.rank, self.size = hvd.rank(), hvd.size()
        self.device = torch.device("cuda", hvd.local_rank()) if device == "gpu" else None

    def all_reduce(self, size: int, repetitions: int) -> list[float]:
        buffer = self.torch.zeros(size // 4, dtype=self.torch.float32, device=self.device)
        times = []
        for _ in range(repetitions):
            self.hvd.barrier()
            start = time.perf_counter()
            # One name per size, as a training step's tensors keep theirs:
            # Horovod's response cache then skips renegotiating it.
            self.hvd.allreduce(buffer, op=self.hvd.Sum, name=f"probe.{size}")
            times.append(time.perf_counter() - start)
        slowest = self.hvd.allreduce(
            self.torch.tensor(times, dtype=self.torch.float64), op=self.hvd.Max, name="probe.times"
        )
        return slowest.tolist()

    def hosts(self) -> list[str]:
        return self.hvd.allgather_object(socket.gethostname())

    def close(self) -> None:
        self.hvd.shutdown()


class TensorFlowRanks:
    """TensorFlow's collective ops as MultiWorkerMirroredStrategy runs them
    (RING over gRPC on CPUs, NCCL on GPUs): the strategy is built as the
    harness builds it (trainscale.frameworks.tensorflow.strategies.MultiWorker), from TF_CONFIG here
    or SLURM's task variables in a job step; a rank is one of its replicas."""

    ecosystem = "tensorflow"
    has_point_to_point = False  # no point-to-point operation in tf.distribute
    # A worker whose peers have gone can block in its gRPC server's teardown.
    finalizes_at_exit = False

    def __init__(self, device: str, nodes: int, ranks_per_node: int):
        import tensorflow as tf

        from trainscale.catalogue.options import RunOptions
        from trainscale.catalogue.settings import RunSettings
        from trainscale.frameworks.tensorflow.strategies import MultiWorker
        from trainscale.harness.backend import Topology

        settings = RunSettings(framework="tf-multiworker", nodes=nodes,
                               gpus_per_node=ranks_per_node, device=device)  # fmt: skip
        worker = MultiWorker(settings, RunOptions(output=""), Topology())
        self.tf, self.strategy = tf, worker.create_strategy()
        self.backend = "nccl" if device == "gpu" else "ring"
        self.rank, self.size = worker.topology.process_index, self.strategy.num_replicas_in_sync
        self.addresses = self.strategy.cluster_resolver.cluster_spec().as_dict()["worker"]
        self.reducers = {}  # a traced all-reduce per float32 count
        self.gatherers = {}  # (times variable, traced all-gather) per repetition count

    def _reducer(self, floats: int):
        """A traced all-reduce of `floats` float32 in every replica (one per size)."""
        if floats not in self.reducers:
            tf, strategy = self.tf, self.strategy
            ones = tf.ones([floats], tf.float32)

            @tf.function
            def reduce():
                def replica():
                    context = tf.distribute.get_replica_context()
                    return context.all_reduce(tf.distribute.ReduceOp.SUM, ones)

                return strategy.experimental_local_results(strategy.run(replica))[0]

            reduce()  # untimed: tracing and the collective's first instance
            self.reducers[floats] = reduce
        return self.reducers[floats]

    def all_reduce(self, size: int, repetitions: int) -> list[float]:
        reduce, barrier, times = self._reducer(size // 4), self._reducer(1), []
        for _ in range(repetitions):
            barrier().numpy()  # tf.distribute has no barrier: a 4-byte all-reduce
            start = time.perf_counter()
            reduce().numpy()  # .numpy() waits for the result (on GPUs too)
            times.append(time.perf_counter() - start)
        return self._slowest(times)

    def _slowest(self, times: list[float]) -> list[float]:
        """Each repetition's time on the slowest worker (an all-gather of every worker's)."""
        tf, strategy = self.tf, self.strategy
        count = len(times)  # the warm-up's, then the sweep's
        if count not in self.gatherers:
            # Captured and read in the replica: all_gather of a tensor passed
            # to strategy.run, or of the variable itself, fails in TF 2.15
            # ("destinations can not be empty").
            mine = tf.Variable(tf.zeros([1, count], tf.float64), trainable=False)

            @tf.function
            def gather():
                def replica():
                    value = tf.identity(mine.read_value())
                    return tf.distribute.get_replica_context().all_gather(value, axis=0)

                return strategy.experimental_local_results(strategy.run(replica))[0]

            self.gatherers[count] = (mine, gather)
        mine, gather = self.gatherers[count]
        mine.assign([times])
        return tf.reduce_max(gather(), axis=0).numpy().tolist()

    def hosts(self) -> list[str]:
        return [address.rpartition(":")[0] for address in self.addresses]

    def close(self) -> None:
        pass


RANKS = {"torch": TorchRanks, "horovod-mpi": HorovodRanks, "horovod-gloo": HorovodRanks,
         "tf": TensorFlowRanks}  # fmt: skip


def sweep(ranks, largest: int, repetitions: int) -> dict:
    """Every measurement of the probe, as rank 0 reports it (other ranks: {})."""
    # Untimed first: gloo connects a pair on its first message, Horovod
    # negotiates a tensor's first all-reduce.
    if ranks.size > 1 and ranks.has_point_to_point:
        ranks.ping_pong(1, 2)
    ranks.all_reduce(4, 2)
    point_to_point = []
    if ranks.size > 1 and ranks.has_point_to_point:
        for size in message_sizes(largest):
            times = ranks.ping_pong(size, repetitions)
            point_to_point.append({"bytes": size, **ping_pong(size, times)} if times else {})
    collective, incast_times = [], []
    for size in collective_sizes(largest):
        times = ranks.all_reduce(size, repetitions)
        bandwidths = collective_bandwidths("all_reduce", ranks.size, size, times)
        collective.append({"bytes": size, **bandwidths})
    # One server and at least two workers: the pattern whose server link binds.
    if ranks.size > 2 and ranks.has_point_to_point:
        ranks.incast(4, 2)  # untimed: each pair's first message
        for size in collective_sizes(largest):
            incast_times.append((size, ranks.incast(size, repetitions)))
    hosts = ranks.hosts()
    if ranks.rank != 0:
        return {}
    # What crosses the network: the workers on another host than the server's.
    remote = sum(host != hosts[0] for host in hosts[1:])
    incast = [
        {"bytes": size, **incast_bandwidth(ranks.size - 1, remote, size, times)}
        for size, times in incast_times
    ]
    return {
        "backend": ranks.backend,
        "ranks": ranks.size,
        "hosts": hosts,
        "link": "inter-node" if len(set(hosts)) > 1 else "intra-node",
        "ping_pong": point_to_point,
        "all_reduce": collective,
        "incast": incast,
        "environment": {v: os.environ[v] for v in INTERFACE_VARIABLES if v in os.environ},
        # Rank 0's own view: its image (in a container) and its isolation.
        "image": image_label(),
        "isolation": isolation_facts(),
    }


def main(argv: list[str] | None = None) -> int:
    from trainscale.core.heap import pause_collection, resume_collection
    from trainscale.core.records import atomic_write_json

    parser = argparse.ArgumentParser(prog="python -m trainscale.network.probe_ranks")
    parser.add_argument("--transport", choices=sorted(RANKS), required=True)
    parser.add_argument("--largest-message-bytes", type=int, required=True)
    parser.add_argument("--repetitions", type=int, required=True)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--ranks-per-node", type=int, default=1)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    pause_collection()  # over the library's import and set-up (trainscale.core.heap)
    ranks = RANKS[args.transport](args.device, args.nodes, args.ranks_per_node)
    resume_collection()
    result = sweep(ranks, args.largest_message_bytes, args.repetitions)
    ranks.close()
    if result:
        atomic_write_json(args.output, {"transport": args.transport, **result})
    if not ranks.finalizes_at_exit:
        print(end="", flush=True)
        os._exit(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
