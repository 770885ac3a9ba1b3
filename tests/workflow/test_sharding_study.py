"""The memory study through local Snakemake, for real, scaled down to 2 CPU
replicas (profiles/local/sharding-memory.yaml is the larger version): DDP,
FSDP2, ZeRO-3 and tensor parallelism on two sizes of the GPT ladder; the
records hold each replica's peak memory and memory capacity, and the sharding
tables and figure follow."""

import os

import pandas as pd
import pytest
from conftest import run_study_in_a_copy, snakemake

from trainscale.core.gpt import GPT_SHAPES, parameter_count

SCHEMES = {"PyTorch DDP", "PyTorch FSDP2", "DeepSpeed (zero_stage=3)", "PyTorch tensor parallel"}
STUDY = {
    "study": "sharding-cpu",
    "reference": None,
    "train_env": ".venv-train",
    "torch_env": ".venv-torch",
    "grid": {
        "framework": ["torch-ddp", "torch-fsdp", "deepspeed", "torch-tp"],
        "nodes": [1],
        "gpus_per_node": [2],
        "model": ["gpt-tiny", "gpt-mini"],
        "batch_size": [2],
        "zero_stage": [3],
    },
    "benchmark": {
        "dataset": "synthetic",
        "seq_len": 32,
        "device": "cpu",
        "warmup_steps": 1,
        "blocks": 2,
        "steps_per_block": 1,
        "tensor_memory": True,
    },
    "figures": {"weak_scaling_framework": "torch-ddp"},
}


@pytest.fixture(scope="module")
def study(run_store):
    return run_study_in_a_copy(run_store, STUDY, until=("sharding",))


@pytest.mark.slow
def test_a_cluster_jobs_snakemake_reads_the_study_as_the_driver_saved_it(study):
    """Over a minute where it is the first to ask for the study (its fixture:
    8 runs of 2 ranks, each profiling a step for its live tensor bytes);
    the check itself is one dry run of a second or so."""
    # A SLURM job runs Snakemake again, given the study's file but not the
    # workflow profile's replace-workflow-config: config.yaml (image_size 224)
    # must not slip under a text study that left image_size to its default
    # (0, as saved), or every job refuses the study (Snakefile).
    repo = os.path.dirname(os.path.dirname(study))
    job = ["--workflow-profile", "none", "--configfiles", "sharding-cpu.yaml", "-n"]
    dry = snakemake(repo, *job)
    assert dry.returncode == 0 and "measured with other settings" not in dry.stderr, dry.stderr


@pytest.mark.slow
def test_the_memory_study_measures_every_scheme_at_every_size(study):
    """Over a minute where it is the first to ask for its study (the
    fixture): 8 runs of 2 ranks, each scheme's own start (DeepSpeed's and
    the tensor-parallel mesh's are slow) and a profiled step."""
    memory = pd.read_csv(os.path.join(study, "tables", "sharding_memory.csv"))
    print(memory[["framework", "model", "parameters", "peak_mib", "vs_ddp"]].to_string())
    assert set(memory["framework"]) == SCHEMES
    assert set(memory["status"]) == {"ok"} and len(memory) == 2 * len(SCHEMES)
    # The whole model's parameters, however it was split.
    for model in ("gpt-tiny", "gpt-mini"):
        counted = set(memory.loc[memory["model"] == model, "parameters"])
        assert counted == {parameter_count(model, 32, 50257)}
    assert (memory["peak_mib"] > 100).all()  # a process's resident memory: libraries too
    assert (memory.loc[memory["framework"] == "PyTorch DDP", "vs_ddp"] == 1).all()
    # What sharding buys, once a model's state outweighs what gathering its
    # blocks costs: gpt-mini's 28.9 M parameters with Adam are 462 MB of
    # state a replica unsharded, and FSDP2 held 238 MiB less than DDP (AMD
    # EPYC, 2 cores). DeepSpeed's ZeRO-3 keeps an fp32 master copy beside an
    # fp32 model: its saving shows in bf16 (tests/torch/test_memory.py).
    mini = memory[memory["model"] == "gpt-mini"].set_index("framework")["peak_mib"]
    assert mini["PyTorch DDP"] - mini["PyTorch FSDP2"] >= 100, mini
    crossover = pd.read_csv(os.path.join(study, "tables", "sharding_crossover.csv"))
    assert set(crossover["framework"]) == SCHEMES
    # The limit is each replica's share of this machine's memory, as recorded.
    assert (crossover["memory_limit_mib"] > 1000).all()
    assert (crossover["largest_fitting_model"] == "gpt-mini").all()
    for ext in ("png", "pdf"):
        assert os.path.getsize(os.path.join(study, "figures", f"sharding_memory.{ext}")) > 0
    # The memory model against the live tensor bytes at each run's peak
    # (tensor_memory: torch's memory timeline, less gloo's copies it never saw
    # freed, step_profile.close_collective_copies, without which FSDP2's
    # gpt-tiny rank read up to two embeddings above the range; a process it
    # cannot count is left out, FSDP2's on gpt-tiny in torch 2.13).
    # DeepSpeed's ZeRO-3 holds its reduce bucket whole, 2.0 GB of fp32
    # gradient at the default (the model's buffers term), and the whole
    # model gathered.
    check = pd.read_csv(os.path.join(study, "tables", "memory_model_check.csv"))
    print(check.drop(columns=["configuration"]).to_string())
    assert len(check) >= 6 and set(check["framework"]) <= SCHEMES
    assert (check["measured_bytes"] > check["predicted_states_bytes"]).all()
    zero3 = check[check["framework"] == "DeepSpeed (zero_stage=3)"]
    assert len(zero3) == 2 and (zero3["predicted_buffers_bytes"] > 2e9).all()
    assert (zero3["error_percent"].abs() < 15).all(), zero3
    for _, row in zero3.iterrows():  # every weight gathered from its forward to its backward
        assert row["predicted_gathered_bytes"] == 4 * parameter_count(row["model"], 32, 50257)
    ddp = check[check["framework"] == "PyTorch DDP"].set_index("model")
    for model in ("gpt-tiny", "gpt-mini"):  # the buckets: a copy of the gradients
        assert ddp.loc[model, "predicted_buffers_bytes"] == 4 * parameter_count(model, 32, 50257)
    # The step's peaks (memory_model.peak_phase) bring DDP and tensor
    # parallelism within 15 % too (measured: +1.2 and -6.9 %, +1.1 and
    # +7.1 %). (A run whose timeline could not be counted has no row: pass
    # 20 lost tensor parallelism's gpt-tiny one.)
    for scheme in ("PyTorch DDP", "PyTorch tensor parallel"):
        errors = check.loc[check["framework"] == scheme, "error_percent"]
        assert len(errors) >= 1 and (errors.abs() < 15).all(), (scheme, errors)
    assert (check["predicted_transients_bytes"] > 0).all()
    # FSDP2 wherever torch 2.13's timeline counted a rank (its data flow
    # asserts "version mismatch" on about half of FSDP2's ranks): gpt-mini's
    # peak is the token embedding's reduce over gloo, the logits held and
    # the unit's whole gradient three times (autograd's, the reduce-scatter's
    # input, gloo's clone of it to all-reduce), -23 % before they were counted.
    fsdp2 = check[check["framework"] == "PyTorch FSDP2"].set_index("model")
    assert (fsdp2["error_percent"].abs() < 15).all(), fsdp2
    # One token embedding's bytes at the peak or not by the ranks' timing
    # (gpt-tiny's ranks of one run apart by it: DDP 182.5 and 195.1 MB,
    # FSDP2 103.8 and 116.6): the torch schemes' predictions are that range
    # (parallel_plan_memory.timing_bytes), DeepSpeed's a number.
    for _, row in check.iterrows():
        torch_scheme = row["framework"] != "DeepSpeed (zero_stage=3)"
        embedding = 4 * 50257 * GPT_SHAPES[row["model"]].width
        assert row["predicted_timing_bytes"] == embedding * torch_scheme, row
    if "gpt-mini" in fsdp2.index:
        logits, embedding = 4 * 2 * 32 * 50257, 4 * 50257 * 256
        assert fsdp2.loc["gpt-mini", "predicted_transients_bytes"] == logits + 3 * embedding
