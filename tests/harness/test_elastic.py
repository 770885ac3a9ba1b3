"""Horovod elastic for TensorFlow, for real: rank 1 of a 2-rank CPU run killed
a few steps into its timed blocks (tests/torch/test_elastic.py has the torch
frameworks, and the definitions the record's `recovery` follows)."""

import pytest
from runs import assert_horovod_elastic_went_on_alone, load_json, trainscale

pytestmark = pytest.mark.slow


def test_horovod_elastic_for_tensorflow_goes_on_without_the_lost_host(tmp_path):
    # 6 blocks of 5 steps, a commit after each; rank 1 dies before step 12.
    output = tmp_path / "record.json"
    trainscale(
        "run", "--framework", "horovod-elastic", "--model", "small_cnn", "--dataset",
        "synthetic", "--image-size", "32", "--device", "cpu", "--gpus-per-node", "2",
        "--batch-size", "8", "--warmup-steps", "2", "--blocks", "6", "--steps-per-block", "5",
        "--collective-timeout", "20", "--fault", "kill-rank1-step12", "--output", str(output),
        check=True, timeout=300,
    )  # fmt: skip
    record = load_json(output)
    assert_horovod_elastic_went_on_alone(record)  # with the step traced again for 1 rank
    assert record["framework_config"]["commits"].endswith("TensorFlowState)")
