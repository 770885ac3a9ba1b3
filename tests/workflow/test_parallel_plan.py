"""`trainscale plan` (trainscale.analysis.parallel_plan): the configurations
a cluster's ranks split into, what each rank holds (the memory model's
counts), each term of the step as the algorithm it models, and the command."""

import dataclasses
import json
import os
import re
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from conftest import REPO, copy_repository, load_yaml, snakemake

from trainscale.analysis.memory_model import (
    activation_bytes,
    block_parameters,
    peak_tensor_bytes,
    rank_parameters,
)
from trainscale.analysis.parallel_plan import (
    Cluster,
    Configuration,
    MemoryBudget,
    Prediction,
    StepTerms,
    Workload,
    configurations,
    plan,
    plan_one,
    stage_flops_per_token,
    step_terms,
)
from trainscale.analysis.parallel_plan_figure import checked, draw_predicted_against_measured
from trainscale.analysis.parallel_plan_fit import configuration_of, fit_terms
from trainscale.analysis.parallel_plan_memory import memory
from trainscale.analysis.parallel_plan_probe import probed_links, with_probed_links
from trainscale.analysis.parallel_plan_validation import render_validation, validate
from trainscale.analysis.predict import BACKWARD_SHARE
from trainscale.cli import main
from trainscale.core.gpt import (
    GPT_SHAPES,
    gpt_shape,
    parameter_count,
    training_flops_per_token,
)

H100_NODES = Cluster(4, 8, 80)
H100_TERMS = StepTerms(0.4 * 989.4e12, intra_gb_per_s=450, inter_gb_per_s=50)
XL = Workload("gpt2-xl", 1024, 50257, global_batch=512)
NO_RUNTIME = MemoryBudget(reserved_gib=0)


def test_a_data_parallel_rank_holds_what_the_memory_model_counts():
    w = Workload("gpt-mini", 128, 1000, global_batch=32, precision="fp32")
    ddp = memory(Configuration(4, 1, 1, 0), w, NO_RUNTIME)
    # The model's count, and DDP's buckets: a second copy of the gradients.
    gradient = 4 * parameter_count("gpt-mini", 128, 1000)
    assert ddp["buffers"] == gradient
    # And one fp32 tensor of the token embedding's size, held at the peak or
    # not by the ranks' timing (timing_bytes): none on one device.
    width = GPT_SHAPES["gpt-mini"].width
    assert ddp["timing"] == 4 * width * 1000
    assert memory(Configuration(1, 1, 1, 0), w, NO_RUNTIME)["timing"] == 0
    rest = sum(ddp.values()) - ddp["buffers"] - ddp["timing"]
    assert rest == peak_tensor_bytes("gpt-mini", 8, 128, 1000)
    # DeepSpeed's ZeRO-1 holds its reduce bucket whole (the declared default
    # unless the run's knobs say otherwise), in the weights' 16-bit type.
    bf16 = dataclasses.replace(w, precision="bf16")
    zero1 = Configuration(4, 1, 1, 1)
    assert memory(zero1, bf16, NO_RUNTIME, "deepspeed")["buffers"] == 2 * 500_000_000
    knobs = {"zero_reduce_bucket_size": 1000}
    assert memory(zero1, bf16, NO_RUNTIME, "deepspeed", knobs)["buffers"] == 2000
    # ZeRO-3 splits all three model states over the 4 replicas, and holds two
    # blocks' weights gathered (the one computing and the one prefetched).
    zero3 = memory(Configuration(4, 1, 1, 3), w, NO_RUNTIME)
    for kind in ("parameters", "optimizer"):
        assert zero3[kind] == pytest.approx(ddp[kind] / 4)
    assert zero3["gathered"] == 2 * 4 * 12 * width * width
    assert zero3["activations"] == ddp["activations"]
    # DeepSpeed's ZeRO-3 keeps gathered every weight it uses again within
    # its reuse distance (10^9 elements: all of gpt-mini, whose next use is
    # in backward), at most its live parameters, and clones the fp32
    # partition it updates beside Adam's two moments.
    whole = parameter_count("gpt-mini", 128, 1000)
    ds3 = memory(Configuration(4, 1, 1, 3), w, NO_RUNTIME, "deepspeed")
    assert ds3["gathered"] == 4 * whole and ds3["optimizer"] == pytest.approx(12 * whole / 4)
    for knobs, kept in (
        ({"zero_max_reuse_distance": 1000}, 500),
        ({"zero_max_live_parameters": 7}, 7),
    ):
        held = memory(Configuration(4, 1, 1, 3), w, NO_RUNTIME, "deepspeed", knobs)
        assert held["gathered"] == 4 * kept, knobs
    # A pipeline's fullest stage: 1F1B's stage s keeps p - s microbatches in
    # flight, GPipe's all m; the last stage holds the head and the loss, and
    # the schedule's outputs of all 8 microbatches.
    for schedule, in_flight in (("1f1b", (2, 1)), ("gpipe", (8, 8))):
        config = Configuration(1, 1, 2, 0, microbatches=8, schedule=schedule)
        held = memory(config, w, NO_RUNTIME)
        totals = [
            peak_tensor_bytes(
                "gpt-mini", 32, 128, 1000, stage=s, stages=2, microbatches=8, schedule=schedule
            )  # fmt: skip
            for s in (0, 1)
        ]
        assert sum(held.values()) == max(totals), schedule
        kept = in_flight[1] * activation_bytes("gpt-mini", 4, 128, 1000, stage=1, stages=2)
        # The loss's backward: two gradients of a microbatch's logits beside
        # the 8 microbatches' logits the schedule keeps.
        assert held["activations"] == kept and held["transients"] == (2 + 8) * 4 * 128 * 1000 * 4
    # The peak is the loss's backward here: every activation, the logits
    # (fp32) held and two more of their size, the head's gradient (whole,
    # before any reduce-scatter) the only one yet (zero_grad sets them to None).
    head = 4 * GPT_SHAPES["gpt-mini"].width * 1000
    assert ddp["gradients"] == zero3["gradients"] == head
    assert ddp["transients"] == zero3["transients"] == 3 * 8 * 128 * 1000 * 4
    # With short sequences it is the optimizer's update: every gradient,
    # the activations freed, the logits held and Adam's temporary over the
    # parameters a rank updates (its shard under ZeRO-3).
    short = Workload("gpt-mini", 16, 1000, global_batch=4, precision="fp32")
    logits = 1 * 16 * 1000 * 4
    for framework, stage, shards in (("torch-ddp", 0, 1), ("deepspeed", 3, 4)):
        held = memory(Configuration(4, 1, 1, stage), short, NO_RUNTIME, framework)
        assert held["activations"] == 0 and held["gradients"] > 0
        assert held["transients"] == 4 * parameter_count("gpt-mini", 16, 1000) / shards + logits
    # FSDP2's fullest moment there is its largest unit's reduce, a block's
    # with this vocabulary (memory_model.unit_reduce_phases): the logits held
    # and the block's whole gradient twice over NCCL (autograd's, the
    # reduce-scatter's input), three times over gloo (its clone to all-reduce).
    block = 4 * block_parameters(GPT_SHAPES["gpt-mini"])
    for collectives, copies in (("nccl", 2), ("gloo", 3)):
        held = memory(Configuration(4, 1, 1, 3), short, NO_RUNTIME, collectives=collectives)
        assert held["activations"] == 0 and held["transients"] == logits + copies * block


def test_the_stages_flops_add_up_to_the_models():
    for stages in (1, 2, 3, 5, 48):
        total = sum(stage_flops_per_token(XL, s, stages) for s in range(stages))
        assert total == training_flops_per_token("gpt2-xl", 1024, 50257), stages


def test_each_term_is_the_algorithm_it_models():
    def terms(config, assumed=H100_TERMS):
        return step_terms(config, H100_NODES, XL, assumed)

    ddp = terms(Configuration(32, 1, 1, 0))
    gradient = 4 * rank_parameters("gpt2-xl", 1024, 50257)
    tokens = 512 * 1024
    flops = training_flops_per_token("gpt2-xl", 1024, 50257) * tokens / 32
    assert ddp["compute"] == pytest.approx(flops / (0.4 * 989.4e12))
    # A ring over 32 replicas of 4 nodes crosses the network: 2(d-1)/d of the bytes.
    assert ddp["data"] == pytest.approx(2 * 31 / 32 * gradient / 50e9)
    assert ddp["bubble"] == ddp["tensor"] == ddp["pipeline"] == 0
    # 8 replicas of 4-way tensor groups: still across nodes; within one: the node's links.
    assert terms(Configuration(8, 4, 1, 3))["data"] > 0
    inside = step_terms(Configuration(8, 1, 1, 0), Cluster(1, 8, 80), XL, H100_TERMS)
    assert inside["data"] == pytest.approx(2 * 7 / 8 * gradient / 450e9)
    # ZeRO-3 moves 3 passes to the all-reduce's 2; overlap hides up to its share of backward.
    assert terms(Configuration(32, 1, 1, 3))["data"] == pytest.approx(1.5 * ddp["data"])
    # Over gloo a reduce-scatter is an all-reduce: ZeRO-1's bf16 gradient in
    # 3 passes (NCCL: 2), ZeRO-3's fp32 one in 4 (NCCL: 3); DDP's unchanged.
    gloo = dataclasses.replace(H100_NODES, collectives="gloo")
    for stage, nccl, over_gloo in ((0, 1, 1), (1, 0.5, 0.75), (3, 1.5, 2)):
        config = Configuration(32, 1, 1, stage)
        assert terms(config)["data"] == pytest.approx(nccl * ddp["data"])
        assert step_terms(config, gloo, XL, H100_TERMS)["data"] == pytest.approx(
            over_gloo * ddp["data"]
        )
    # ZeRO-3's calls per unit (48 blocks and the root), 3 each, of 31 ring steps.
    zero3 = Configuration(32, 1, 1, 3)
    called = terms(zero3, dataclasses.replace(H100_TERMS, shard_call_s=1e-6))["data"]
    assert called - terms(zero3)["data"] == pytest.approx(3 * 49 * 31 * 1e-6)
    # DeepSpeed ZeRO-1 and 2's own cost: once a step, whatever the model.
    for stage in (1, 2):
        config = Configuration(32, 1, 1, stage)
        stepped = terms(config, dataclasses.replace(H100_TERMS, partition_step_s=1e-3))["data"]
        assert stepped - terms(config)["data"] == pytest.approx(1e-3)
    hidden = terms(Configuration(32, 1, 1, 0), dataclasses.replace(H100_TERMS, overlap=0.5))
    assert hidden["data"] == pytest.approx(ddp["data"] - 0.5 * BACKWARD_SHARE * ddp["compute"])
    # Checkpointing: a second forward, 8N for 6N.
    assert terms(Configuration(32, 1, 1, 0, checkpointing=True))["compute"] == pytest.approx(
        ddp["compute"] * 4 / 3
    )
    # Tensor parallelism: 4 all-reduces a block a microbatch of its activations.
    tp = terms(Configuration(4, 8, 1, 3))
    activations = 512 // 4 * 1024 * 1600 * 2
    assert tp["tensor"] == pytest.approx(4 * 48 * 2 * 7 / 8 * activations / 450e9)
    # The pipeline: (p-1)/m of the slowest stage's compute idle; its sends both ways.
    pp = terms(Configuration(8, 1, 4, 0, microbatches=16))
    assert pp["bubble"] == pytest.approx(pp["compute"] * 3 / 16)
    assert pp["pipeline"] == pytest.approx(2 * 16 * 512 // 8 // 16 * 1024 * 1600 * 2 / 50e9)
    slowest = max(stage_flops_per_token(XL, s, 4) for s in range(4))
    assert pp["compute"] == pytest.approx(slowest * tokens / 8 / (0.4 * 989.4e12))


def test_the_configurations_split_every_rank_and_say_what_runs_them():
    node = Cluster(1, 4, 80)
    found = configurations(node, Workload("gpt-mini", 128, 1000, global_batch=32))
    assert all(c.data * c.tensor * c.pipeline == 4 for c in found)
    assert {(c.data, c.tensor, c.pipeline) for c in found} == {
        (4, 1, 1),
        (2, 2, 1),
        (1, 4, 1),
        (2, 1, 2),
        (1, 1, 4),
        (1, 2, 2),
    }
    runs_as = {(c.data, c.tensor, c.pipeline, c.shard_stage): c.runs_as() for c in found}
    assert runs_as[4, 1, 1, 0] == ("torch-ddp", "deepspeed zero_stage=0")
    assert runs_as[4, 1, 1, 3] == ("torch-fsdp", "deepspeed zero_stage=3")
    assert runs_as[2, 2, 1, 3] == ("torch-tp tensor_parallel=2",)
    assert runs_as[1, 4, 1, 0] == ("torch-tp tensor_parallel=4",)
    assert runs_as[1, 1, 4, 0][0].startswith("torch-pipeline")
    # PP x DP: torch-pipeline's two pipelines; with ZeRO, or 3-D: predicted only.
    pp_dp = next(c for c in found if (c.data, c.pipeline, c.shard_stage) == (2, 2, 0))
    assert pp_dp.runs_as() == (
        f"torch-pipeline pipeline_stages=2 pipeline_microbatches={pp_dp.microbatches} "
        f"pipeline_schedule={pp_dp.schedule}",
    )
    assert runs_as[2, 1, 2, 1] == runs_as[1, 2, 2, 0] == ()
    # A record's settings name its configuration back.
    knobs = {"pipeline_stages": 2, "pipeline_microbatches": 0, "pipeline_schedule": "gpipe"}
    assert configuration_of("torch-pipeline", 4, knobs) == Configuration(
        2, 1, 2, 0, 2, schedule="gpipe"
    )
    assert configuration_of("torch-pipeline", 4, {}) == Configuration(1, 1, 4, 0, 4)
    # gpt-mini's 4 heads: no 8-way tensor group on 8 GPUs.
    eight = configurations(Cluster(1, 8, 80), Workload("gpt-mini", 128, 1000, 32))
    assert max(c.tensor for c in eight) == 4


def test_a_model_too_big_for_data_parallelism_fits_sharded():
    predictions = plan(Cluster(4, 8, 24), XL, MemoryBudget(), H100_TERMS)
    fits = {p.configuration.name: p.fits for p in predictions}
    # 16 bytes a parameter in fp32 with Adam: 26 GB of 1.64 B parameters.
    assert not fits["dp32 tp1 pp1"] and fits["dp32 tp1 pp1 zero3 ckpt"]
    ranked = [p.fits for p in predictions]
    assert ranked == sorted(ranked, reverse=True)  # those that fit first
    speeds = [p.tokens_per_sec for p in predictions if p.fits]
    assert speeds == sorted(speeds, reverse=True)


def test_a_model_given_as_a_shape_is_planned_as_the_ladder_model_of_that_shape(capsys):
    # gpt2-xl written as a shape: the same counts and the same ranking, to the byte.
    shape = gpt_shape("L48-H1600-A25")
    assert (shape.layers, shape.width, shape.heads) == (48, 1600, 25)
    assert parameter_count("L48-H1600-A25", 1024, 50257) == parameter_count("gpt2-xl", 1024, 50257)
    written = dataclasses.replace(XL, model="L48-H1600-A25")
    ladder = plan(Cluster(4, 8, 80), XL, MemoryBudget(), H100_TERMS)
    shaped = plan(Cluster(4, 8, 80), written, MemoryBudget(), H100_TERMS)
    assert [(p.configuration, p.seconds, p.memory_bytes) for p in shaped] == [
        (p.configuration, p.seconds, p.memory_bytes) for p in ladder
    ]
    # A 7 B shape no ladder has, through the command: its sequence given.
    args = ["plan", "--model", "L32-H4096-A32", "--nodes", "2", "--gpus-per-node", "8"]
    args += ["--device", "H100", "--device-memory-gib", "80"]
    args += ["--intra-gb-per-s", "300", "--inter-gb-per-s", "50"]
    assert main(args) == 2
    assert "--model L32-H4096-A32 is a shape: give its --seq-len" in capsys.readouterr().err
    assert main([*args, "--seq-len", "2048"]) == 0
    assert "# L32-H4096-A32 (6.86 B parameters, 2048 tokens, batch 512" in capsys.readouterr().out
    for bad in ("L32-H4096-A30", "gpt-huge"):
        with pytest.raises(SystemExit):
            main(["plan", "--model", bad, "--nodes", "1"])
        assert "argument --model" in capsys.readouterr().err


def test_the_command_plans_a_system_of_a_study_and_labels_what_it_assumed(capsys, tmp_path):
    config = os.path.join(REPO, "studies", "seed004.yaml")
    args = [
        "plan",
        "--model",
        "gpt2-small",
        "--nodes",
        "2",
        "--config",
        config,
        "--system",
        "node9-v100",
        "--precision",
        "fp16",
        # 16 sequences of 1024 tokens a rank: 512 would hold 13 GB of logits
        # (50257 a token, fp32), three times over in the loss's backward.
        "--global-batch",
        "128",
    ]
    assert main(args) == 2
    assert "no positive --intra-gb-per-s, --inter-gb-per-s" in capsys.readouterr().err
    links = ["--intra-gb-per-s", "130", "--inter-gb-per-s", "12.5"]
    assert main([*args, *links, "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "on 2 x 4 devices of 32 GiB\n" in out
    assert "| 1 | " in out and "none: assumed" in out
    assert (
        "a rank's compute, TFLOP/s achieved: 50, assumed (--mfu 0.4 of a 125 TFLOP/s peak)" in out
    )
    assert "No 95 % band: every term is assumed" in out
    assert (tmp_path / "parallel_plan.md").read_text() == out
    rows = (tmp_path / "parallel_plan.csv").read_text().splitlines()
    assert rows[0].startswith("configuration,data,tensor,pipeline") and len(rows) > 10
    assert main([*args[:-4], "--system", "node7", *links]) == 2
    err = capsys.readouterr().err
    assert "defines no system 'node7'; it defines node5-titan-rtx, node9-v100" in err


def _probe_record(folder, link: str, busbw: float, seconds: float) -> str:
    """A `trainscale probe` record of 2 gloo ranks on `link`: its all-reduce
    sweep at a flat bus bandwidth, the smallest taking `seconds`."""
    sweep = [
        {"bytes": size, "seconds": seconds if size == 4 else size / busbw, "busbw": busbw}
        for size in (4, 2**20, 2**28)
    ]
    record = {"kind": "network_probe", "network": "", "nodes": 2 if link == "inter-node" else 1}
    record.update(transport="torch-gloo", ranks=2, link=link, all_reduce=sweep)
    path = folder / f"{link}.json"
    path.write_text(json.dumps(record))
    return str(path)


def test_the_links_come_from_the_probes_records_where_the_study_fits_none(capsys, tmp_path):
    intra = _probe_record(tmp_path, "intra-node", 90e9, 20e-6)
    inter = _probe_record(tmp_path, "inter-node", 12e9, 40e-6)
    args = ["plan", "--model", "gpt2-small", "--nodes", "2", "--gpus-per-node", "4"]
    args += ["--device", "V100", "--device-memory-gib", "32", "--precision", "fp16"]
    args += ["--global-batch", "128"]  # 512 would not fit: its logits alone
    assert main([*args, "--probe", intra, inter]) == 0
    out = capsys.readouterr().out
    assert "bus bandwidth between a node's devices, GB/s: 90, probed: torch-gloo" in out
    assert "one device's share of the network, GB/s: 12, probed: torch-gloo" in out
    assert "latency of a ring step across nodes, µs: 20, probed" in out  # 40 µs over 2 steps
    # A link the study's cells only took equal to the other takes the probe's.
    fitted = fit_terms(_made_study(tmp_path), MINI, StepTerms(1.0, 100, 10))
    probed = probed_links([inter], 4 * parameter_count("gpt-mini", 128, 1000))
    labels = dict(fitted.labels)
    terms, draws, labels = with_probed_links(fitted.terms, fitted.draws, labels, probed)
    assert terms.inter_gb_per_s == pytest.approx(12)
    assert {round(d.inter_gb_per_s, 6) for d in draws} == {12.0}
    assert terms.intra_gb_per_s == fitted.terms.intra_gb_per_s  # fitted: kept
    assert labels["inter_gb_per_s"].startswith("probed: torch-gloo all-reduce on 2 ranks")


# A study made with known terms: gpt-mini's one-rank runs at 20 GFLOP/s,
# torch-ddp on 1, 2 and 4 ranks of one node over a 2 GB/s link with 50 µs a
# ring step and nothing hidden, and torch-tp on 2 ranks whose all-reduces
# cost 300 µs each besides.
TRUE_FLOPS, TRUE_GB_PER_S, TRUE_LATENCY, TRUE_TENSOR_CALL = 2e10, 2.0, 50e-6, 300e-6
TRUE_SHARD_CALL = 8e-3  # its calls a third of the FSDP2 step, as on the lab
TRUE_PARTITION_STEP = 30e-3  # a tenth of the ZeRO-1 step, as on the lab
MINI = Workload("gpt-mini", 128, 1000, global_batch=8, precision="fp32")
MINI_4 = dataclasses.replace(MINI, global_batch=4)


def _made_study(folder, sharded: bool = False) -> str:
    rng = np.random.default_rng(0)
    per_sequence = training_flops_per_token("gpt-mini", 128, 1000) * 128
    gradient = 4 * parameter_count("gpt-mini", 128, 1000)
    rows = []
    true = StepTerms(
        TRUE_FLOPS,
        TRUE_GB_PER_S,
        TRUE_GB_PER_S,
        TRUE_LATENCY,
        TRUE_LATENCY,
        tensor_call_s=TRUE_TENSOR_CALL,
        shard_call_s=TRUE_SHARD_CALL,
        partition_step_s=TRUE_PARTITION_STEP,
    )
    tensor = Configuration(1, 2, 1, 0)  # 2 sequences a rank: a global batch of 4
    tensor_step = sum(step_terms(tensor, Cluster(1, 2, 16), MINI_4, true).values())
    # FSDP2 and ZeRO-1 over gloo (the records' device is the CPU): 4 and 3
    # passes, and their own costs.
    gloo = Cluster(1, 2, 16, "gloo")
    steps = {
        "torch-fsdp": sum(step_terms(Configuration(2, 1, 1, 3), gloo, MINI_4, true).values()),
        "deepspeed": sum(step_terms(Configuration(2, 1, 1, 1), gloo, MINI_4, true).values()),
    }
    for framework, gpus in (
        ("torch-single", 1),
        ("torch-ddp", 1),
        ("torch-ddp", 2),
        ("torch-ddp", 4),
        ("torch-tp", 2),
        *((("torch-fsdp", 2), ("deepspeed", 2)) if sharded else ()),
    ):
        compute = 2 * per_sequence / TRUE_FLOPS  # 2 sequences a replica
        ring = 2 * (gpus - 1) * (gradient / gpus / (TRUE_GB_PER_S * 1e9) + TRUE_LATENCY)
        step = {"torch-tp": tensor_step, **steps}.get(framework, compute + ring)
        samples = gpus * 2 / step * (1 + 0.002 * rng.standard_normal(4))
        settings = {
            "model": "gpt-mini",
            "seq_len": 128,
            "vocab_size": 1000,
            "batch_size": 2,
            "precision": "fp32",
            "optimizer": "adam",
            "device": "cpu",
            "tensor_parallel": 2,
            "zero_stage": 1,  # read by deepspeed's run only
        }
        record = {
            "schema": 1,
            "framework": framework,
            "training_flops_per_image": per_sequence,
            "settings": settings,
            "trainable_parameters": gradient // 4,
            "images_per_sec": {
                "mean": samples.mean(),
                "std": samples.std(),
                "samples": list(samples),
            },
        }
        path = folder / f"{framework}-{gpus}.json"
        path.write_text(json.dumps(record))
        rows.append(
            {
                "framework": framework,
                "model": "gpt-mini",
                "image_size": 0,
                "batch_size": 2,
                "knobs": "",
                "nodes": 1,
                "gpus_per_node": gpus,
                "gpus": gpus,
                "status": "ok",
                "images_per_sec_mean": samples.mean(),
                "images_per_sec_std": samples.std(),
                "tokens_per_sec_mean": 128 * samples.mean(),
                "record": str(path),
            }
        )
    pd.DataFrame(rows).to_csv(folder / "throughput.csv", index=False)
    return str(folder / "throughput.csv")


def test_the_terms_fitted_to_records_made_with_them_are_the_ones_they_were_made_with(tmp_path):
    assumed = StepTerms(1.0, intra_gb_per_s=100, inter_gb_per_s=10)
    fitted = fit_terms(_made_study(tmp_path), MINI, assumed)
    terms = fitted.terms
    assert terms.flops_per_sec == pytest.approx(TRUE_FLOPS, rel=0.01)
    assert terms.intra_gb_per_s == pytest.approx(TRUE_GB_PER_S, rel=0.1)
    assert fitted.labels["flops_per_sec"] == "fitted: 2 one-rank run(s) of gpt-mini"
    assert fitted.labels["intra_gb_per_s"].startswith("fitted: PyTorch DDP, gpt-mini b2")
    # No cell crossed nodes: the network is the node's link, and said so.
    assert terms.inter_gb_per_s == terms.intra_gb_per_s
    assert fitted.labels["inter_gb_per_s"].startswith("taken equal to the other link")
    assert len(fitted.draws) == 200
    assert terms.tensor_call_s == pytest.approx(TRUE_TENSOR_CALL, rel=0.1)
    assert fitted.labels["tensor_call_s"] == "fitted: the excess of 1 measured run(s) over the rest"
    assert "send_s" not in fitted.labels  # no pipeline run: it stays assumed
    assert "shard_call_s" not in fitted.labels  # nor a ZeRO-3 or FSDP2 one
    assert "partition_step_s" not in fitted.labels  # nor a ZeRO-1 or 2 one
    # The model misses the measured runs by the records' 0.2 % noise only.
    assert 0 < terms.model_error < 0.01
    assert fitted.labels["model_error"] == "fitted: the RMS error over 3 measured run(s)"
    # The measured DDP cells, predicted back with their band.
    node = Cluster(1, 4, 16)
    for measured in fitted.measured:
        config, workload, rate = measured.configuration, measured.workload, measured.tokens_per_sec
        assert config.name in ("dp2 tp1 pp1", "dp4 tp1 pp1", "dp1 tp2 pp1")
        assert measured.cluster.gpus_per_node == config.data * config.tensor
        predicted = plan_one(config, node, workload, MemoryBudget(), terms, fitted.draws)
        assert predicted.tokens_per_sec == pytest.approx(rate, rel=0.02)
        assert predicted.band[0] < rate < predicted.band[1]
    assert sorted(m.framework for m in fitted.measured) == ["torch-ddp", "torch-ddp", "torch-tp"]
    # The same check as the plan's figure draws it: each on its own cluster shape.
    pairs = checked(fitted.measured, terms, fitted.draws)
    assert [abs(pair.error_percent) < 2 and pair.inside_band for pair in pairs] == [True] * 3
    figure = tmp_path / "predicted_vs_measured.png"
    draw_predicted_against_measured(pairs, str(figure))
    assert plt.imread(figure).shape[:2] == (624, 1152)  # 9.6 x 5.2 inches at 120 dpi
    # A model error over 51 % takes a band's low end to 0 (a rate is not
    # negative): the figure's log axes still take their limits, from the
    # positive rates (the plan loop beside stress-ng warned that they had not).
    loose = [
        dataclasses.replace(p, predicted=dataclasses.replace(p.predicted, model_error=0.6))
        for p in pairs
    ]
    assert [pair.predicted.band[0] for pair in loose] == [0.0] * 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib: "non-positive xlim ... will be ignored"
        draw_predicted_against_measured(loose, str(figure))


def test_the_models_own_error_widens_every_band():
    config = Configuration(2, 1, 1, 0)
    rates = tuple(np.linspace(99.0, 101.0, 201))
    tight = Prediction(config, {}, {"compute": 1.0}, True, 100, rates)
    wide = dataclasses.replace(tight, model_error=0.1)
    assert tight.band == pytest.approx((99.05, 100.95))
    assert wide.band == pytest.approx((99.05 * (1 - 0.196), 100.95 * 1.196))


def test_the_sharded_schemes_own_costs_are_fitted_to_their_runs_over_gloo(tmp_path):
    assumed = StepTerms(1.0, intra_gb_per_s=100, inter_gb_per_s=10)
    fitted = fit_terms(_made_study(tmp_path, sharded=True), MINI, assumed)
    for term, true in (
        ("shard_call_s", TRUE_SHARD_CALL),
        ("partition_step_s", TRUE_PARTITION_STEP),
    ):
        assert getattr(fitted.terms, term) == pytest.approx(true, rel=0.1), term
        assert fitted.labels[term] == "fitted: the excess of 1 measured run(s) over the rest"
    runs = {m.framework: m for m in fitted.measured}
    assert runs["torch-fsdp"].cluster.collectives == runs["deepspeed"].cluster.collectives == "gloo"
    assert runs["torch-fsdp"].configuration.name == "dp2 tp1 pp1 zero3"
    assert runs["deepspeed"].configuration.name == "dp2 tp1 pp1 zero1"


def test_each_scheme_is_held_out_and_the_regret_is_taken_where_two_compete(tmp_path):
    assumed = StepTerms(1.0, intra_gb_per_s=100, inter_gb_per_s=10)
    v = validate(_made_study(tmp_path), MINI, assumed)
    # DDP's 4-rank run, predicted from its 1- and 2-rank runs: the link they fit.
    ((scheme, ddp),) = v.held_out
    assert scheme == "torch-ddp" and ddp.measured.configuration.name == "dp4 tp1 pp1"
    assert abs(ddp.error_percent) < 2 and ddp.inside_band
    assert v.one_size == ("torch-tp",)  # one size: nothing of its own to hold out
    # At 2 ranks, fitted on the one-rank runs only, the plan knows no
    # all-reduce's own cost: it ranks tensor parallelism first, which ran
    # slower than DDP.
    assert v.ranks == 2 and v.choice.startswith("torch-tp") and v.best.startswith("torch-ddp")
    assert 0 < v.regret < 0.05
    text = render_validation(v)
    assert "torch-ddp: held-out MAPE" in text and "1 of 1 in band" in text
    assert f"it ran {100 * v.regret:.1f} % slower than the best, torch-ddp" in text


LOOP = [
    "plan",
    "--model",
    "gpt-tiny",
    "--seq-len",
    "32",
    "--vocabulary",
    "256",
    "--global-batch",
    "4",
    "--precision",
    "fp32",
    "--nodes",
    "1",
    "--gpus-per-node",
    "2",
    "--device-memory-gib",
    "4",
    "--peak-tflops",
    "0.1",
    "--intra-gb-per-s",
    "100",
    "--inter-gb-per-s",
    "100",
]


@pytest.mark.slow
def test_a_plan_writes_the_study_that_fits_its_terms_and_replans_from_it(tmp_path, capsys):
    """plan -> snakemake -> plan --measured on the local profile, for real:
    the study the first plan writes (torch-single, torch-ddp on 1 and 2
    ranks, and the first choice) trains on 2 CPU ranks, and the second plan
    fits its terms to the records, with bands, and holds each configuration
    measured against its prediction. Four real runs through Snakemake: 24 s
    alone on a Zen 5 AMD EPYC, 92 s beside the suite's two other workers
    and stress-ng (the tensor-parallel mesh's start the longest)."""
    repo = copy_repository(str(tmp_path / "repo"))
    study = os.path.join(repo, "plan-loop.yaml")
    args = [*LOOP, "--write-study", study, "--study-name", "plan-loop", "--study-device", "cpu"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "none: assumed" in first and "- torch-ddp on 1 x 2: the link in a node" in first
    # With these assumed terms, tensor parallelism over the 2 ranks comes first.
    assert "- torch-tp tensor_parallel=2 on 1 x 2: choice 1" in first
    config = load_yaml(study)
    assert config["grid"]["framework"][:2] == ["torch-single", "torch-ddp"]
    loop_study = ["--profile", "profiles/local", "--configfile", "plan-loop.yaml"]
    result = snakemake(repo, *loop_study, "--until", "collect")  # the records' table it reads
    assert result.returncode == 0, result.stderr[-4000:]

    measured = os.path.join(repo, "results", "plan-loop", "throughput.csv")
    replanned = tmp_path / "replanned"
    again = [*LOOP, "--measured", measured, "--write-study", study, "--output-dir", str(replanned)]
    assert main(again) == 0
    second = capsys.readouterr().out
    assert plt.imread(replanned / "predicted_vs_measured.png").ndim == 3  # the figure of the table
    assert "none: assumed" not in second, second
    assert "a rank's compute, TFLOP/s achieved" in second
    assert "fitted: 2 one-rank run(s) of gpt-tiny" in second
    assert "fitted: PyTorch DDP, gpt-tiny b2, 2 cells" in second
    # The tensor-parallel run fits its all-reduce's own cost (gloo's and
    # DTensor's dispatch on a CPU, which the first plan assumed none of).
    assert "a tensor-parallel all-reduce's own cost, µs:" in second
    assert "fitted: the excess of 1 measured run(s) over the rest" in second
    # Every multi-rank run is held against its prediction, with its band.
    table = second.split("predicted with the terms above:")[1].split("To measure next")[0]
    rows = {line.split(" | ")[0]: line for line in table.splitlines() if line.startswith("| dp")}
    assert set(rows) == {"| dp2 tp1 pp1", "| dp1 tp2 pp1"}, table
    assert all(re.search(r"\| [\d,]+-[\d,]+ \| [+-]\d", row) for row in rows.values()), table
    # Validated with the plan: DDP's 2-rank run held out, and the regret
    # where DDP and tensor parallelism compete.
    assert "torch-ddp: held-out MAPE" in second and "Regret at 2 ranks" in second
    # What it measured it does not ask for again.
    asked = second.split("To measure next")[1]
    assert "the link in a node" not in asked and "torch-tp" not in asked, asked
    assert "choice 1" in asked
