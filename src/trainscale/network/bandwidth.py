"""What a network probe measures, as definitions: the message sizes it sweeps
and the bandwidths it reports. Pure Python: a probe times messages (over
torch.distributed, MPI, Horovod: not built yet); this turns times into numbers.

Definitions (NetPIPE's for point to point, nccl-tests' for collectives):
- Sizes: every power of two from 1 byte to the largest, each also perturbed
  by ±3 bytes (NetPIPE's default), so a size that happens to suit a
  transport's buffers does not stand for its neighbours.
- Point to point (ping-pong): one message there and back. Latency is half the
  round trip; bandwidth is the message's bytes over that half.
- Collectives: algorithm bandwidth algbw = S / t, S the buffer's bytes, t its
  time. Bus bandwidth busbw = algbw x a factor that makes ranks' counts
  comparable with the link's peak: 2(n-1)/n for all-reduce (each byte
  crosses a link twice, as reduce-scatter then all-gather), (n-1)/n for
  all-gather and reduce-scatter, 1 for broadcast and reduce. One rank moves
  nothing: its factor is 0.
- Incast (a parameter server's pattern): every other rank sends S bytes to
  one rank (many-to-one), which then sends S bytes back to each (one-to-many),
  as n-1 workers send their gradients to one server and read the parameters
  back. The server's link carries 2(n-1)S; its bandwidth is that over the
  time (the step model's parameter-server exchange, trainscale.analysis.predict).
  Across hosts, the network carries the remote workers' 2rS of it.
- A size's time is the median of its repetitions: the first repetition pays
  connection set-up and the odd one a scheduler's pause.
"""

from __future__ import annotations

import statistics

NETPIPE_PERTURBATION = 3  # bytes either side of each power of two


def message_sizes(largest: int, perturbation: int = NETPIPE_PERTURBATION) -> list[int]:
    """NetPIPE's sweep: powers of two up to `largest`, each with its neighbours
    `perturbation` bytes away (sizes below 1 byte or above `largest` left out)."""
    if largest < 1:
        raise ValueError(f"the largest message must be at least 1 byte, not {largest}")
    sizes = set()
    power = 1
    while power <= largest:
        for size in (power - perturbation, power, power + perturbation):
            if 1 <= size <= largest:
                sizes.add(size)
        power *= 2
    return sorted(sizes)


def bus_factor(collective: str, ranks: int) -> float:
    """nccl-tests' factor from algorithm to bus bandwidth for `ranks` ranks."""
    if ranks < 1:
        raise ValueError(f"a collective needs at least 1 rank, not {ranks}")
    factors = {
        "all_reduce": 2 * (ranks - 1) / ranks,
        "all_gather": (ranks - 1) / ranks,
        "reduce_scatter": (ranks - 1) / ranks,
        "broadcast": 1.0 if ranks > 1 else 0.0,
        "reduce": 1.0 if ranks > 1 else 0.0,
    }
    if collective not in factors:
        raise ValueError(f"unknown collective {collective!r}: one of {', '.join(factors)}")
    return factors[collective]


def collective_bandwidths(collective: str, ranks: int, size: int, seconds: list[float]) -> dict:
    """A collective of `size` bytes on `ranks` ranks, timed `seconds` per repetition:
    its median time, algorithm and bus bandwidth (bytes per second)."""
    time = statistics.median(seconds)
    algbw = size / time
    return {"seconds": time, "algbw": algbw, "busbw": algbw * bus_factor(collective, ranks)}


def ping_pong(size: int, round_trips: list[float]) -> dict:
    """A message of `size` bytes there and back, `round_trips` seconds per
    repetition: one-way latency (seconds) and bandwidth (bytes per second)."""
    one_way = statistics.median(round_trips) / 2
    return {"latency": one_way, "bandwidth": size / one_way}


def incast_bandwidth(workers: int, remote_workers: int, size: int, seconds: list[float]) -> dict:
    """`workers` ranks each sending `size` bytes to one rank and receiving `size`
    bytes back, timed `seconds` per repetition: the median time, the bandwidth
    of the one rank's link, and of the network's share of it, the
    `remote_workers` on other hosts (bytes per second)."""
    time = statistics.median(seconds)
    server_bytes = 2 * workers * size
    return {
        "seconds": time,
        "server_bytes": server_bytes,
        "server_link_bw": server_bytes / time,
        "remote_workers": remote_workers,
        "network_bw": 2 * remote_workers * size / time,
    }
