"""Model parallelism trains a GPT as torch-single does on the full batch.

As tests/torch/test_equivalence.py for the data-parallel frameworks: the same
seed, initial weights and GLOBAL batch (synthetic tokens are drawn by their
place in the global batch, so it is the same however it is split); gpt-tiny;
plain SGD; 2 steps (one warm-up, one timed); 2 CPU ranks. torch-ddp is the
data-parallel yardstick beside the model-parallel frameworks. A pipeline that
scaled its microbatches' gradients twice, or a stage that lost a block,
would be off by far more than float32's rounding.
"""

import pytest
from runs import assert_options_recorded, assert_trains_like_one_device, gpt_run
from test_equivalence import MODEL_PARALLEL

from trainscale.core.gpt import parameter_count, training_flops_per_token

# Measured on this code (AMD EPYC, 2 cores; the printed lines): 5.96e-8 for
# DDP, both pipeline schedules and the 2 x 2 mesh, one float32 step (2**-24)
# at 1.0, where the layer norms' scales sit, from another summation order;
# 1.19e-7 (two steps) for tensor parallelism alone, whose row-wise layers add
# their ranks' partial products after the sum. VGG-16 has no weight near 1,
# so its DDP difference is 7.5e-9. Four such steps are allowed.
ATOL = 2.4e-7


@pytest.fixture(scope="module")
def reference(run_store):
    return gpt_run(run_store, "torch-single", 1).weights()


CASES = [  # every model-parallel framework, and DDP beside them
    ("torch-ddp", []),
    # (GPipe: the 2 x 2 pipelines' test below.)
    # Its defaults, 1F1B over 4 microbatches: the run its text example is held to.
    ("torch-pipeline", []),
    ("torch-tp", []),
    # FSDP2 shards each transformer block; recomputing a block's activations
    # in backward changes no number.
    ("torch-fsdp", ["--activation-checkpointing"]),
]


@pytest.mark.slow
def test_tensor_parallel_groups_with_fsdp2_across_them_train_as_one_device_does(
    run_store, reference
):
    # 4 ranks: a 2 x 2 mesh, FSDP2 over "dp", tensor parallel over "tp".
    options = ["--tensor-parallel", "2"]
    run = gpt_run(run_store, "torch-tp", 4, *options)
    assert_trains_like_one_device(reference, run.weights(), ATOL, "torch-tp 2 x 2")
    assert_options_recorded(run.record["settings"], options)
    _check_text_record(run.record, 4)


@pytest.mark.slow
def test_two_pipelines_with_ddp_across_them_train_as_one_device_does(run_store, reference):
    # 4 ranks: 2 pipelines of 2 stages (PP x DP), GPipe over 2 microbatches
    # of each pipeline's half of the batch; DDP all-reduces each stage's
    # gradients with the other pipeline's same stage.
    options = ["--pipeline-stages", "2", "--pipeline-schedule", "gpipe"]
    options += ["--pipeline-microbatches", "2"]
    run = gpt_run(run_store, "torch-pipeline", 4, *options)
    assert_trains_like_one_device(reference, run.weights(), ATOL, "torch-pipeline 2 x 2")
    assert_options_recorded(run.record["settings"], options)
    config = run.record["framework_config"]
    assert (config["stages"], config["pipelines"], config["microbatches"]) == (2, 2, 2), config
    _check_text_record(run.record, 4)


def _check_text_record(record: dict, replicas: int) -> None:
    """What a GPT run records beyond an image run's: its rates in tokens, the
    counted FLOPs and the whole model's parameters, on every rank."""
    assert record["status"] == "ok" and record["replicas"] == record["processes"] == replicas
    assert record["tokens_per_example"] == 16
    tokens, examples = record["tokens_per_sec"]["mean"], record["images_per_sec"]["mean"]
    assert tokens == pytest.approx(16 * examples)
    assert record["trainable_parameters"] == parameter_count("gpt-tiny", 16, 96)
    assert record["training_flops_per_image"] == 16 * training_flops_per_token("gpt-tiny", 16, 96)


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "options"), CASES, ids=[" ".join([f, *o]) for f, o in CASES])
def test_two_ranks_train_a_gpt_as_one_device_does(run_store, reference, framework, options):
    run = gpt_run(run_store, framework, 2, *options)
    assert_trains_like_one_device(reference, run.weights(), ATOL, " ".join([framework, *options]))
    assert_options_recorded(run.record["settings"], options)
    _check_text_record(run.record, 2)


def test_every_model_parallel_framework_has_a_case():
    assert set(MODEL_PARALLEL) <= {framework for framework, _ in CASES}
