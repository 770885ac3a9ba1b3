"""`trainscale probe` for real: torch.distributed's gloo and Horovod's MPI
ranks on this machine, started as their frameworks' training ranks are.

The arithmetic (sizes, bus bandwidth) is tested on synthetic timings in
tests/workflow/test_bandwidth.py; here the ranks run and time messages. The
shaped link whose rate is known is the SLURM lab's (tests/workflow/test_slurm.py).
"""

from __future__ import annotations

import pytest
from runs import load_json, trainscale

from trainscale.catalogue.registry import REGISTRY
from trainscale.catalogue.settings import RunSettings
from trainscale.network.bandwidth import message_sizes
from trainscale.network.probe import TRANSPORTS
from trainscale.network.probe_ranks import collective_sizes

LARGEST = 2**20
# The ping-pong test's largest message: with another test's ranks on both
# cores, a byte's trip waits for the scheduler (2.0 ms one way, seen in a
# make-test run on a 2-core AMD VM, against a MiB's 1.9 ms in the same
# sweep); 16 MiB takes ten times that on loopback.
PING_PONG_LARGEST = 2**24


def probe(transport: str, tmp_path, ranks: int = 2, largest: int = LARGEST) -> dict:
    output = tmp_path / f"{transport}.json"
    trainscale(
        "probe", "--transport", transport, "--largest-message-bytes", str(largest),
        "--repetitions", "5", "--network-name", "lo", "--output", str(output),
        "--ranks-per-node", str(ranks), timeout=300, check=True,
    )  # fmt: skip
    assert not list(tmp_path.glob("*.rank0.json")), "the ranks' partial record was left"
    return load_json(output)


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_each_framework_of_ranks_names_a_transport_the_probe_has(launcher):
    transports = {
        spec.name: spec.launch.probe_transport(
            RunSettings(framework=spec.name, horovod_launcher=launcher)
        )
        for spec in REGISTRY
    }
    assert set(transports.values()) <= {"", *TRANSPORTS}
    assert transports["torch-ddp"] == transports["ray-train"] == "torch"
    assert transports["horovod"] == transports["horovod-torch"] == f"horovod-{launcher}"
    assert transports["tf-multiworker"] == "tf"  # its collective ops (tests/harness/test_probe.py)
    assert transports["torch-single"] == transports["tf-mirrored"] == ""


@pytest.mark.slow
def test_the_torch_probe_times_ping_pong_and_all_reduce_between_two_gloo_ranks(tmp_path):
    largest = PING_PONG_LARGEST
    record = probe("torch", tmp_path, largest=largest)
    assert (record["transport"], record["backend"], record["ranks"]) == ("torch", "gloo", 2)
    assert record["link"] == "intra-node" and len(record["hosts"]) == 2
    assert record["network"] == "lo"
    assert [p["bytes"] for p in record["ping_pong"]] == message_sizes(largest)
    assert [c["bytes"] for c in record["all_reduce"]] == collective_sizes(largest)
    assert record["incast"] == []  # a server needs 2 workers at least
    ping = {p["bytes"]: p for p in record["ping_pong"]}
    # A byte's trip is all latency, 16 MiB's mostly bandwidth: the rate grows
    # by orders of magnitude with the size, and 16 MiB take longer than a byte.
    assert ping[largest]["bandwidth"] > 100 * ping[1]["bandwidth"]
    assert ping[largest]["latency"] > ping[1]["latency"] > 0
    for row in record["all_reduce"]:
        # Two ranks: every byte crosses the link twice over the two halves,
        # 2(n-1)/n = 1 (nccl-tests).
        assert row["busbw"] == pytest.approx(row["algbw"])
        assert row["algbw"] == pytest.approx(row["bytes"] / row["seconds"])


@pytest.mark.slow
def test_the_torch_probe_times_a_parameter_servers_incast_on_three_ranks(tmp_path):
    # Rank 0 the server, 2 workers: each sends a message and gets one back,
    # so the server's link carries 4 messages a repetition.
    record = probe("torch", tmp_path, ranks=3)
    assert [row["bytes"] for row in record["incast"]] == collective_sizes(LARGEST)
    for row in record["incast"]:
        assert row["server_bytes"] == 4 * row["bytes"]
        assert row["server_link_bw"] == pytest.approx(row["server_bytes"] / row["seconds"])
    incast = {row["bytes"]: row for row in record["incast"]}
    assert incast[LARGEST]["server_link_bw"] > 100 * incast[4]["server_link_bw"]


@pytest.mark.slow
def test_the_horovod_probe_times_all_reduce_over_mpi_and_has_no_ping_pong(tmp_path):
    record = probe("horovod-mpi", tmp_path)
    assert (record["transport"], record["backend"], record["ranks"]) == ("horovod-mpi", "mpi", 2)
    assert record["ping_pong"] == []  # Horovod has no point-to-point operation
    reduce = {c["bytes"]: c for c in record["all_reduce"]}
    # Horovod's background cycle sets a small message's time: a MiB moves
    # orders of magnitude more bytes per second than 4 bytes.
    assert reduce[LARGEST]["busbw"] > 1000 * reduce[4]["busbw"] > 0
