"""The network probe's definitions (trainscale.network.bandwidth) on synthetic timings:
NetPIPE's size sweep, ping-pong latency and bandwidth, nccl-tests' bus bandwidth."""

import pytest

from trainscale.network.bandwidth import bus_factor, collective_bandwidths, message_sizes, ping_pong


def test_the_sweep_is_netpipes_powers_of_two_and_their_neighbours():
    assert message_sizes(16) == [1, 2, 4, 5, 7, 8, 11, 13, 16]
    assert message_sizes(1) == [1]
    sizes = message_sizes(256 * 2**20)
    assert sizes[-1] == 256 * 2**20 and sizes == sorted(set(sizes))
    assert {2**20 - 3, 2**20, 2**20 + 3} <= set(sizes)
    assert message_sizes(16, perturbation=0) == [1, 2, 4, 8, 16]
    with pytest.raises(ValueError, match="at least 1 byte"):
        message_sizes(0)


@pytest.mark.parametrize(
    ("collective", "ranks", "factor"),
    [
        ("all_reduce", 1, 0.0),
        ("all_reduce", 2, 1.0),
        ("all_reduce", 4, 1.5),
        ("all_reduce", 8, 1.75),
        ("all_gather", 4, 0.75),
        ("reduce_scatter", 2, 0.5),
        ("broadcast", 4, 1.0),
        ("broadcast", 1, 0.0),
    ],
)
def test_bus_bandwidth_factor_is_nccl_tests(collective, ranks, factor):
    assert bus_factor(collective, ranks) == pytest.approx(factor)


def test_an_unknown_collective_or_no_rank_is_refused():
    with pytest.raises(ValueError, match="unknown collective 'all_to_all'"):
        bus_factor("all_to_all", 4)
    with pytest.raises(ValueError, match="at least 1 rank"):
        bus_factor("all_reduce", 0)


def test_collective_bandwidths_from_the_median_time():
    # 100 MB all-reduced on 4 ranks: repetitions of 0.9, 0.1 (an outlier), 0.1 s.
    got = collective_bandwidths("all_reduce", 4, 100_000_000, [0.9, 0.1, 0.1])
    assert got["seconds"] == pytest.approx(0.1)
    assert got["algbw"] == pytest.approx(1e9)
    assert got["busbw"] == pytest.approx(1.5e9)


def test_ping_pong_halves_the_round_trip():
    # 1 MB there and back in 2 ms: 1 ms one way, 1 GB/s.
    got = ping_pong(1_000_000, [0.002, 0.002, 0.010])
    assert got["latency"] == pytest.approx(0.001)
    assert got["bandwidth"] == pytest.approx(1e9)
