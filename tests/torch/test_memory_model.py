"""The memory model (trainscale.analysis.memory_model) against what it
models: the ZeRO paper's own counts of model states, and, byte for byte,
the tensors autograd saves in a forward pass of trainscale's torch GPT."""

import os

import pytest
import torch
import torch.nn.functional as F
from runs import gpt_run

from trainscale.analysis.memory_model import (
    activation_bytes,
    model_state_bytes,
    peak_tensor_bytes,
    rank_parameters,
)
from trainscale.core.gpt import GPT_SHAPES, parameter_count
from trainscale.frameworks.torch.torch_gpt import Gpt, keep_stage

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def saved_for_backward(model: str, batch: int, seq_len: int, vocabulary: int, precision: str,
                       checkpointing: bool, stage: int = 0, stages: int = 1) -> int:  # fmt: skip
    """Bytes of every distinct storage autograd saves in one forward (and
    loss, on the last stage) of pipeline stage `stage` of `stages` of the
    model, its own parameters left out (they are model states)."""
    torch.manual_seed(0)
    gpt = keep_stage(Gpt(model, seq_len, vocabulary), stage, stages)
    gpt.checkpoint_activations = checkpointing
    return _saved_in_forward(gpt, model, batch, seq_len, vocabulary, precision, stage, stages)


def _saved_in_forward(gpt, model, batch, seq_len, vocabulary, precision, stage, stages) -> int:
    parameters = {_storage(p).data_ptr() for p in gpt.parameters()}
    saved = {}

    def pack(tensor):
        storage = _storage(tensor)
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    if stage == 0:
        inputs = torch.randint(0, vocabulary, (batch, seq_len))
    else:  # the activations the stage before sent
        width = GPT_SHAPES[model].width
        inputs = torch.randn(batch, seq_len, width, requires_grad=True)
    targets = torch.randint(0, vocabulary, (batch, seq_len))
    dtype = AUTOCAST.get(precision)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast("cpu", dtype, enabled=dtype is not None):
            outputs = gpt(inputs)
        if stage == stages - 1:  # the loss as the torch backends take it (torch_backend.loss)
            F.cross_entropy(outputs.float().flatten(0, -2), targets.flatten(), reduction="sum")
    return sum(saved.values())


@pytest.mark.parametrize(
    ("model", "batch", "seq_len", "vocabulary", "precision", "checkpointing"),
    [
        ("gpt-mini", 2, 32, 256, "fp32", False),
        ("gpt-tiny", 3, 16, 96, "fp32", False),
        ("gpt-mini", 2, 32, 256, "bf16", False),
        ("gpt-tiny", 3, 16, 96, "fp16", False),
        ("gpt-mini", 2, 32, 256, "fp32", True),
        ("gpt-mini", 2, 32, 256, "bf16", True),
    ],
)
def test_the_activations_are_what_autograd_saves_to_the_byte(
    model, batch, seq_len, vocabulary, precision, checkpointing
):
    measured = saved_for_backward(model, batch, seq_len, vocabulary, precision, checkpointing)
    predicted = activation_bytes(model, batch, seq_len, vocabulary, precision, checkpointing)
    assert predicted == measured


def _storage(tensor):
    """A tensor's storage; a tensor-parallel one's (a DTensor) its local shard's."""
    return getattr(tensor, "_local_tensor", tensor).untyped_storage()


def _tensor_parallel_rank(rank: int, port: int, results) -> None:
    """One of 2 gloo ranks splitting gpt-mini's blocks as torch-tp does: what
    a forward keeps, in fp32 and under bf16 autocast."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from trainscale.frameworks.torch.torch_tp import block_plan

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        gpt = Gpt("gpt-mini", 32, 256)
        plan = block_plan()
        for block in gpt.blocks.values():
            parallelize_module(block, mesh, plan)
        saved = _saved_in_forward(gpt, "gpt-mini", 2, 32, 256, precision, 0, 1)
        results[rank, precision] = saved
    results[rank, "parameters"] = sum(_storage(p).nbytes() // 4 for p in gpt.parameters())
    dist.destroy_process_group()


@pytest.mark.slow  # two processes' torch imports and a gloo group: not the inner loop
def test_a_tensor_parallel_rank_keeps_the_split_share_of_each_block():
    from trainscale.core.ports import free_ports

    with torch.multiprocessing.Manager() as manager:
        results = manager.dict()
        port = free_ports(1)[0]
        torch.multiprocessing.spawn(_tensor_parallel_rank, args=(port, results), nprocs=2)
        measured = dict(results)
    for precision in ("fp32", "bf16"):
        predicted = activation_bytes("gpt-mini", 2, 32, 256, precision, tensor_ranks=2)
        assert [measured[rank, precision] for rank in (0, 1)] == [predicted] * 2, precision
    parameters = rank_parameters("gpt-mini", 32, 256, tensor_ranks=2)
    assert [measured[rank, "parameters"] for rank in (0, 1)] == [parameters] * 2


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_each_pipeline_stage_keeps_its_own_blocks_ends_and_weight_copies(precision):
    # gpt-mini's 4 blocks over 3 stages: 2, 1 and 1 (torch_gpt.stage_blocks).
    for stage in range(3):
        measured = saved_for_backward("gpt-mini", 2, 32, 256, precision, False, stage, 3)
        predicted = activation_bytes("gpt-mini", 2, 32, 256, precision, False, stage, 3)
        assert predicted == measured, stage
        held = keep_stage(Gpt("gpt-mini", 32, 256), stage, 3).parameters()
        assert rank_parameters("gpt-mini", 32, 256, 1, stage, 3) == sum(p.numel() for p in held)


def test_model_states_are_the_zero_papers_counts():
    # Rajbhandari et al. 2020, figure 1: 7.5 B parameters, Adam in mixed
    # precision (K = 12), 64 data-parallel ranks: 120, 31.4, 16.6, 1.9 GB.
    gigabytes = [
        round(sum(model_state_bytes(7.5e9, "adam", "bf16", 64, stage).values()) / 1e9, 1)
        for stage in (0, 1, 2, 3)
    ]
    assert gigabytes == [120.0, 31.4, 16.6, 1.9]
    # Autocast keeps the model in fp32: 4 + 4 + 8 bytes a parameter; plain
    # SGD keeps no state.
    assert model_state_bytes(250, "adam") == {
        "parameters": 1000.0, "gradients": 1000.0, "optimizer": 2000.0,
    }  # fmt: skip
    assert model_state_bytes(1000, "sgd", data_parallel=2, shard_stage=3)["optimizer"] == 0
    # DeepSpeed clones the fp32 partition it updates even in an fp32 run.
    assert model_state_bytes(1000, "adam", data_parallel=2, shard_stage=1, master=True) == {
        "parameters": 4000.0, "gradients": 4000.0, "optimizer": 6000.0,
    }  # fmt: skip
    # Unsplit, a rank holds the whole model, as core.gpt counts it.
    for model in GPT_SHAPES:
        assert rank_parameters(model, 1024, 50257) == parameter_count(model, 1024, 50257)


@pytest.mark.slow
def test_a_runs_profiled_tensor_memory_is_the_memory_models(run_store):
    """The shared GPT runs (runs.gpt_run: gpt-tiny, --tensor-memory): the
    parameter bytes torch's memory timeline saw at the profiled step's peak,
    on the largest process, are what rank_parameters says that rank holds
    (fp32: 4 bytes each). A pipeline's largest process is its first stage."""
    expected = {
        ("torch-single", 1): rank_parameters("gpt-tiny", 16, 96),
        ("torch-tp", 2): rank_parameters("gpt-tiny", 16, 96, tensor_ranks=2),
        ("torch-pipeline", 2): rank_parameters("gpt-tiny", 16, 96, stage=0, stages=2),
    }
    for (framework, replicas), parameters in expected.items():
        record = gpt_run(run_store, framework, replicas).record
        assert record["settings"]["tensor_memory"] is True
        by_category = record["peak_tensor_bytes_by_category"]
        assert by_category["parameter"] == 4 * parameters, framework
        # Resident memory holds the libraries besides: far more than the tensors.
        assert record["peak_tensor_bytes"] < record["peak_memory_bytes"] / 10, framework
    # torch 2.13's memory timeline sometimes asserts ("version mismatch") on
    # a rank of FSDP2 with activation checkpointing: the record then says so
    # in a line, and the run stands.
    record = gpt_run(run_store, "torch-fsdp", 2, "--activation-checkpointing").record
    assert record["status"] == "ok"
    error = record.get("peak_tensor_bytes_error")
    assert record["peak_tensor_bytes"] or error, record
    assert error is None or "AssertionError: version mismatch" in error, error
    # The whole peak, within the 15 % (measured: -13.7 % and -2.6 %:
    # with 96 tokens of vocabulary the peak falls inside the backward pass,
    # some gradients made, some activations freed, between the two moments
    # the model counts; the pipeline's first stage -18 %: the model has no
    # term yet for the activations a stage receives and sends, bench/README.md).
    for framework, replicas, split in (("torch-single", 1, 1), ("torch-tp", 2, 2)):
        record = gpt_run(run_store, framework, replicas).record
        # A tensor-parallel rank trains its group's whole batch.
        predicted = peak_tensor_bytes("gpt-tiny", 8, 16, 96, "sgd", tensor_ranks=split)
        assert predicted == pytest.approx(record["peak_tensor_bytes"], rel=0.15), framework
