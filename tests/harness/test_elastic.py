"""Horovod elastic for TensorFlow, for real, its custom loop and Keras's fit:
rank 1 of a 2-rank CPU run killed a few steps into its timed blocks
(tests/torch/test_elastic.py has the torch frameworks, and the definitions
the record's `recovery` follows)."""

import pytest
from runs import assert_horovod_elastic_went_on_alone, load_json, trainscale

pytestmark = pytest.mark.slow


# Horovod's elastic state of each: the custom loop's and Keras fit's.
STATES = {"horovod-elastic": "TensorFlowState", "horovod-elastic-fit": "KerasState"}


@pytest.mark.parametrize("framework", list(STATES))
def test_horovod_elastic_for_tensorflow_goes_on_without_the_lost_host(tmp_path, framework):
    # 6 blocks of 5 steps, a commit after each; rank 1 dies before step 12.
    output = tmp_path / "record.json"
    trainscale(
        "run", "--framework", framework, "--model", "small_cnn", "--dataset",
        "synthetic", "--image-size", "32", "--device", "cpu", "--gpus-per-node", "2",
        "--batch-size", "8", "--warmup-steps", "2", "--blocks", "6", "--steps-per-block", "5",
        "--collective-timeout", "20", "--fault", "kill-rank1-step12", "--output", str(output),
        check=True, timeout=300,
    )  # fmt: skip
    record = load_json(output)
    assert_horovod_elastic_went_on_alone(record)  # with the step traced again for 1 rank
    assert record["framework_config"]["commits"] == f"in memory (hvd.elastic.{STATES[framework]})"
