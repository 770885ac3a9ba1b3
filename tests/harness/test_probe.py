"""`trainscale probe --transport tf` for real: TensorFlow's collective ops
between two MultiWorkerMirroredStrategy workers on this machine (RING over
gRPC), started as tf-multiworker's training workers are (TF_CONFIG).

The torch and Horovod probes: tests/torch/test_probe.py; the arithmetic:
tests/workflow/test_bandwidth.py.
"""

from __future__ import annotations

import pytest
from runs import load_json, trainscale

from trainscale.network.probe_ranks import collective_sizes

LARGEST = 2**18


@pytest.mark.slow
def test_the_tensorflow_probe_times_the_collective_all_reduce_of_two_workers(tmp_path):
    output = tmp_path / "tf.json"
    trainscale(
        "probe", "--transport", "tf", "--largest-message-bytes", str(LARGEST),
        "--repetitions", "3", "--output", str(output), timeout=300, check=True,
    )  # fmt: skip
    record = load_json(output)
    assert (record["transport"], record["backend"], record["ranks"]) == ("tf", "ring", 2)
    assert record["link"] == "intra-node" and record["hosts"] == ["localhost", "localhost"]
    assert record["ping_pong"] == []  # tf.distribute has no point-to-point operation
    assert [c["bytes"] for c in record["all_reduce"]] == collective_sizes(LARGEST)
    reduce = {c["bytes"]: c for c in record["all_reduce"]}
    # A quarter MiB moves orders of magnitude more bytes per second than 4
    # bytes, whose time is the collective's fixed cost (a tf.function call and
    # gRPC's round trips).
    assert reduce[LARGEST]["busbw"] > 1000 * reduce[4]["busbw"] > 0
    assert all(row["busbw"] == pytest.approx(row["algbw"]) for row in record["all_reduce"])
