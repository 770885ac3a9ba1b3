"""What one rank of a GPT training step holds, known before any run: its
model states (parameters, gradients, optimizer states) and the activations
its forward pass keeps for the backward one. A plan's first question about a
configuration is whether it fits.

Model states, as the ZeRO paper counts them (Rajbhandari et al. 2020, §3.1):
Ψ parameters trained with Adam in mixed precision hold 2Ψ bytes of 16-bit
weights, 2Ψ of 16-bit gradients and KΨ of optimizer states, K = 12 (an fp32
copy of the weights and Adam's two moments); kept in fp32 (torch's autocast
keeps the model in fp32), 4Ψ + 4Ψ and K = 8. Plain SGD keeps no state of its
own. ZeRO stage 1 splits the optimizer states over the data-parallel ranks,
stage 2 the gradients too, stage 3 (and FSDP2) the weights too; tensor and
pipeline parallelism split the model before any of that.

Activations: what autograd saves in one forward of trainscale's own GPT
(frameworks/torch/torch_gpt.py) and its loss, tensor by tensor; a test holds
each count to the bytes `torch.autograd.graph.saved_tensors_hooks` sees
(tests/torch/test_memory_model.py). It is Korthikanti et al. 2022's
accounting (§4.1: 34sbh + 5as²b bytes a layer, in 16 bits) for this network,
which has no dropout (their three masks and dropout's output) and uses
`scaled_dot_product_attention`, whose flash kernels keep one fp32
log-sum-exp per head and token instead of the a·s² softmax. In fp32 a block
keeps 16 numbers per token and width: its input, its two layer norms' input
and output, q, k and v, attention's output, and the MLP's 4-wide hidden
layer before and after GELU. Under autocast the layer norms and the residual
stream stay in fp32, each projection casts the norm's output to 16 bits
anew (three copies for q, k and v), and the 16-bit copies of the weights are
kept for backward too. With activation checkpointing a block keeps its
input only (and recomputes the rest in backward, one block at a time).

A step's peak is one of three moments (peak_phase), as torch's memory
timeline shows them (the sharding study's live tensor bytes): the loss's
backward, with every activation kept, the logits the step holds and two
more tensors of their size (the gradients of log-softmax's output and of the
logits), and the head's gradient the only parameter gradient yet (zero_grad
sets them to None); backward entering the last block, the logits' gradients
freed and its gradient made (with a small vocabulary, the larger); or the
optimizer's update, the activations freed, every gradient there, the logits
still held and, for Adam (torch's foreach implementation), a temporary the
size of the parameters a rank updates (the square root of the second
moment). FSDP2 adds two (unit_reduce_phases): it reduce-scatters each
unit's gradient (a block, the embedding, the head) as backward makes it,
and while one reduces, the unit's whole gradient is held in copies.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainscale.catalogue.knobs import ZERO_PREFETCH_BUCKET, ZERO_REDUCE_BUCKET
from trainscale.core.gpt import (
    MLP_RATIO,
    GptShape,
    embedding_parameters,
    gpt_shape,
    stage_blocks,
)

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Optimizer state an fp32 model's parameter holds (Adam: two moments).
OPTIMIZER_STATE_BYTES = {"adam": 8, "sgd": 0}
# int64 token ids kept by the embeddings and the loss: 8 bytes each.
ID_BYTES = 8


def model_state_bytes(
    parameters: int,
    optimizer: str = "adam",
    weights: str = "fp32",
    data_parallel: int = 1,
    shard_stage: int = 0,
    master: bool = False,
) -> dict[str, float]:
    """The bytes of the parameters, gradients and optimizer states of a rank
    holding `parameters` before any ZeRO split (rank_parameters: after the
    tensor and pipeline splits).

    `weights`: what the framework keeps the model in, fp32 (autocast, or no
    mixed precision) or a 16-bit type with an fp32 master copy in the
    optimizer (DeepSpeed's bf16 and fp16). `master`: an fp32 master copy
    with fp32 weights too (DeepSpeed's ZeRO optimizers clone the partition
    they update whatever its type). `shard_stage`, as ZeRO's stage 1-3,
    splits over the `data_parallel` ranks (FSDP2 is stage 3)."""
    weight = BYTES[weights]
    optimizer_bytes = OPTIMIZER_STATE_BYTES[optimizer]
    if weights != "fp32" or master:
        optimizer_bytes += BYTES["fp32"]  # the master copy
    split = [data_parallel if shard_stage >= stage else 1 for stage in (3, 2, 1)]
    return {
        "parameters": weight * parameters / split[0],
        "gradients": weight * parameters / split[1],
        "optimizer": optimizer_bytes * parameters / split[2],
    }


def buffer_bytes(
    framework: str, parameters: int, gradient: str, shard_stage: int, knobs: Mapping = {}
) -> float:
    """What a framework allocates beside the model states of a rank holding
    `parameters` (before ZeRO's split), its gradients in `gradient`'s type:
    DDP's buckets, a flat copy of every gradient (torch's DDP keeps them
    apart from .grad unless gradient_as_bucket_view); DeepSpeed's reduce
    bucket at ZeRO 1-3, held whole whatever the model's size (2.0 GB at its
    default in fp32, as torch's memory timeline found on gpt-tiny and
    gpt-mini alike), and at ZeRO-3 its prefetch bucket of weights, at most
    the model. `knobs`: a run's settings (the knobs' defaults where it has none)."""
    each = BYTES[gradient]
    if framework == "torch-ddp":
        return each * parameters
    if framework != "deepspeed" or shard_stage == 0:
        return 0.0
    reduce, prefetch = (
        int(knob.value_in(knobs)) for knob in (ZERO_REDUCE_BUCKET, ZERO_PREFETCH_BUCKET)
    )
    return each * (reduce + (min(prefetch, parameters) if shard_stage == 3 else 0))


def rank_parameters(
    model: str,
    seq_len: int,
    vocabulary: int,
    tensor_ranks: int = 1,
    stage: int = 0,
    stages: int = 1,
) -> int:
    """The parameters one rank holds before any ZeRO or FSDP2 split: its
    pipeline stage's blocks, each split over `tensor_ranks` ranks (the
    column-split projections' weights and biases divided, the row-split
    ones' weights divided and biases whole, the norms whole), with the
    embeddings on the first stage and the final norm and head on the last."""
    shape = gpt_shape(model)
    width = shape.width
    held = len(stage_blocks(shape.layers, stage, stages)) * block_parameters(shape, tensor_ranks)
    if stage == 0:
        held += embedding_parameters(shape, seq_len, vocabulary)
    if stage == stages - 1:
        held += 2 * width + width * vocabulary  # the final norm and the head
    return held


def block_parameters(shape: GptShape, tensor_ranks: int = 1) -> int:
    """A block's parameters on one of `tensor_ranks` ranks (rank_parameters' split)."""
    width, hidden, t = shape.width, MLP_RATIO * shape.width, tensor_ranks
    columns = (3 * (width * width + width) + width * hidden + hidden) // t  # q, k, v; MLP in
    rows = (width * width + hidden * width) // t + 2 * width  # attention out, MLP out
    return columns + rows + 2 * 2 * width  # and the two norms


def _block_bytes(shape: GptShape, tokens: int, precision: str, tensor_ranks: int = 1) -> int:
    """What one block keeps for backward, `tokens` = batch x sequence, on
    one of `tensor_ranks` ranks splitting it as Megatron-LM does (q, k,
    v and the MLP's input projection by columns, the output projections by
    rows): the norms and the residual stream stay whole on every rank, what
    lies between the projections is split."""
    width, t = shape.width, tensor_ranks
    hidden = MLP_RATIO * width
    norm_stats = 2 * 2 * tokens * BYTES["fp32"]  # mean and 1/std, two norms
    log_sum_exp = shape.heads // t * tokens * BYTES["fp32"]
    # q, k, v and attention's output, the MLP's two 4x activations: split.
    split = (4 * width + 2 * hidden) // t * tokens
    if precision == "fp32":
        # the input and the attention norm's output; the MLP norm's in and out
        return BYTES["fp32"] * (4 * width * tokens + split) + norm_stats + log_sum_exp
    half = BYTES[precision]
    fp32_stream = 2 * width * tokens * BYTES["fp32"]  # each norm's input
    # q, k and v each cast the attention norm's output anew, the MLP's input
    # projection the MLP norm's: whole on every rank.
    casts = 4 * width * tokens
    return fp32_stream + half * (casts + split) + norm_stats + log_sum_exp


def _half_weight_copies(
    shape: GptShape, blocks: int, head_outputs: int, precision: str, tensor_ranks: int = 1
) -> int:
    """Autocast's 16-bit copies of the Linear weights of `blocks` blocks (a
    tensor-parallel rank's share) and of a head of `head_outputs` (the
    vocabulary; 0: no head), kept for backward."""
    if precision == "fp32":
        return 0
    per_block = block_linear_weights(shape, tensor_ranks)
    return BYTES[precision] * (blocks * per_block + shape.width * head_outputs)


def block_linear_weights(shape: GptShape, tensor_ranks: int = 1) -> int:
    """The weights (biases left out) of a block's Linear layers, q, k, v and
    attention's output and the MLP's two, on one of `tensor_ranks` ranks."""
    width, hidden = shape.width, MLP_RATIO * shape.width
    return (4 * width * width + 2 * width * hidden) // tensor_ranks


def activation_bytes(
    model: str,
    batch: int,
    seq_len: int,
    vocabulary: int,
    precision: str = "fp32",
    checkpointing: bool = False,
    stage: int = 0,
    stages: int = 1,
    tensor_ranks: int = 1,
) -> int:
    """Bytes the forward pass and the loss keep for backward, for one
    (micro)batch of `batch` sequences, on pipeline stage `stage` of
    `stages` (the first holds the token ids, the last the final norm, the
    head and the loss; one stage: the whole model, as a data-parallel rank
    holds it). `precision`: fp32, or bf16/fp16 under torch's autocast."""
    shape = gpt_shape(model)
    tokens = batch * seq_len
    blocks = len(stage_blocks(shape.layers, stage, stages))
    if checkpointing:
        kept = blocks * shape.width * tokens * BYTES["fp32"]  # each block's input
    else:
        kept = blocks * _block_bytes(shape, tokens, precision, tensor_ranks)
    if stage == 0:
        kept += ID_BYTES * (tokens + seq_len)  # the token and position ids
    last = stage == stages - 1
    if last:
        kept += (
            shape.width * tokens * (BYTES["fp32"] + BYTES[precision])  # final norm in, head in
            + 2 * tokens * BYTES["fp32"]  # its mean and 1/std
            + vocabulary * tokens * BYTES["fp32"]  # log-softmax's output, in fp32
            + ID_BYTES * tokens  # the targets
            + BYTES["fp32"]  # the loss's total weight (one number)
        )
    copied = 0 if checkpointing else blocks  # a recomputed block's copies are made anew
    return kept + _half_weight_copies(shape, copied, vocabulary * last, precision, tensor_ranks)


def microbatches_in_flight(schedule: str, microbatches: int, stage: int, stages: int) -> int:
    """The microbatches whose activations stage `stage` holds at once: GPipe
    runs every forward before any backward (all of them); 1F1B starts a
    backward as soon as the last stage can, so stage i holds at most
    stages - i (Narayanan et al. 2021, PipeDream-Flush)."""
    if schedule == "gpipe":
        return microbatches
    return min(microbatches, stages - stage)


def peak_tensor_bytes(
    model: str,
    batch: int,
    seq_len: int,
    vocabulary: int,
    optimizer: str = "adam",
    precision: str = "fp32",
    checkpointing: bool = False,
    tensor_ranks: int = 1,
    stage: int = 0,
    stages: int = 1,
    microbatches: int = 1,
    schedule: str = "1f1b",
) -> int:
    """What one rank of data parallelism, tensor parallelism or a pipeline
    stage holds at most in a step (no ZeRO or FSDP2 split): its weights,
    gradients and optimizer states, and every activation it keeps until the
    backward pass, for as many microbatches as its schedule keeps in flight
    (`batch` sequences a rank a step, cut into `microbatches`), at the
    largest of its peaks (peak_phase), with a pipeline's last stage's kept
    outputs."""
    peak = stage_peak(
        model, batch // microbatches, seq_len, vocabulary, optimizer, precision, checkpointing,
        tensor_ranks, stage, stages, microbatches, schedule, keeps_outputs=stages > 1,
    )  # fmt: skip
    return int(sum(peak.values()))


def stage_peak(
    model: str,
    microbatch: int,
    seq_len: int,
    vocabulary: int,
    optimizer: str,
    precision: str,
    checkpointing: bool,
    tensor_ranks: int,
    stage: int,
    stages: int,
    microbatches: int,
    schedule: str,
    weights: str = "fp32",
    data_parallel: int = 1,
    shard_stage: int = 0,
    keeps_outputs: bool = False,
    master: bool = False,
    reduce_copies: int = 0,
) -> dict[str, float]:
    """One pipeline stage's rank at its step's peak, by kind (peak_phase):
    its model states after the tensor, pipeline and ZeRO splits
    (model_state_bytes, with `master`), the activations of the microbatches
    in flight, and the step's transients; `keeps_outputs`: a pipeline
    schedule keeps every microbatch's logits on its last stage;
    `reduce_copies`: FSDP2's copies of a unit's gradient while it reduces
    (unit_reduce_phases; 0: no FSDP2)."""
    parameters = rank_parameters(model, seq_len, vocabulary, tensor_ranks, stage, stages)
    states = model_state_bytes(parameters, optimizer, weights, data_parallel, shard_stage, master)
    kept = activation_bytes(
        model, microbatch, seq_len, vocabulary, precision, checkpointing, stage, stages,
        tensor_ranks,
    )  # fmt: skip
    kept *= microbatches_in_flight(schedule, microbatches, stage, stages)
    logits = logits_bytes(microbatch * seq_len, vocabulary) if stage == stages - 1 else 0
    outputs = microbatches * logits if keeps_outputs else 0
    updated = parameters / (data_parallel if shard_stage else 1)  # the optimizer's share
    first = first_gradient_bytes(model, vocabulary, tensor_ranks, stage, stages)
    reduces = ()
    if reduce_copies:
        embedding = BYTES["fp32"] * gpt_shape(model).width * vocabulary * (stage == 0)
        held = outputs or logits
        reduces = unit_reduce_phases(
            states, kept, held, first, embedding, reduce_copies, data_parallel
        )
    return peak_phase(states, kept, logits, updated, optimizer, first, outputs, reduces)


def peak_phase(
    states: dict,
    activations: float,
    logits: int,
    parameters_updated: float,
    optimizer: str,
    first_gradients: tuple[float, float] = (0.0, 0.0),
    kept_outputs: int = 0,
    more_phases: tuple[dict, ...] = (),
) -> dict[str, float]:
    """What a rank holds at its step's peak, by kind (states: model_state_bytes'),
    the largest of the three moments of the module's docstring. `logits`:
    one (micro)batch's bytes on this rank (0 on a pipeline stage without the
    head); `parameters_updated`: those its optimizer updates;
    `first_gradients`: the bytes of the head's gradient and of one block's,
    the first made (first_gradient_bytes); `kept_outputs`: a pipeline
    schedule's kept outputs (every microbatch's logits, merged when the
    schedule's step returns, before the update), which stand for the logits
    a plain step holds through its update; `more_phases`: a scheme's own
    moments (unit_reduce_phases)."""
    head, block = first_gradients
    held = kept_outputs or logits
    loss = {**states, "gradients": head, "activations": activations}
    loss["transients"] = 2 * logits + held
    blocks = {**loss, "gradients": head + block, "transients": held}
    temporary = BYTES["fp32"] * parameters_updated if optimizer == "adam" else 0
    update = {**states, "activations": 0.0, "transients": temporary + (0 if kept_outputs else held)}
    return max(loss, blocks, update, *more_phases, key=lambda phase: sum(phase.values()))


def unit_reduce_phases(
    states: dict,
    activations: float,
    held: int,
    first_gradients: tuple[float, float],
    embedding: float,
    copies: int,
    ranks: int,
) -> tuple[dict, dict]:
    """FSDP2's two fullest moments, as torch's memory timeline shows them
    (torch.distributed.fsdp's foreach_reduce): a unit's reduce holds its
    whole gradient `copies` times (autograd's, which is still referenced,
    and the reduce-scatter's input it is copied into: 2; gloo, which has no
    reduce-scatter, clones that input to all-reduce it: 3), beside the
    `held` logits. Backward's first reduces (the head's, then the last
    block's) come with every activation still kept but log-softmax's output
    (the loss's backward has freed it: the size of the logits) and those
    two units' gradient shards made; the last (the token embedding's, whole
    `embedding` bytes, the largest unit with a GPT-2 vocabulary) with the
    activations freed and every shard made."""
    head, block = first_gradients
    first = {
        **states,
        "gradients": (head + block) / ranks,
        "activations": max(0, activations - held),
        "transients": held + copies * max(head, block),
    }
    last = {**states, "activations": 0.0, "transients": held + copies * max(embedding, block)}
    return first, last


def first_gradient_bytes(
    model: str, vocabulary: int, tensor_ranks: int = 1, stage: int = 0, stages: int = 1
) -> tuple[float, float]:
    """The fp32 gradients backward makes first on this stage, before it has
    freed much: the head's (on the last stage, whole on every tensor rank)
    and one block's (peak_phase)."""
    shape = gpt_shape(model)
    head = BYTES["fp32"] * shape.width * vocabulary if stage == stages - 1 else 0
    has_blocks = bool(stage_blocks(shape.layers, stage, stages))
    return head, BYTES["fp32"] * block_parameters(shape, tensor_ranks) * has_blocks


def logits_bytes(tokens: int, vocabulary: int) -> int:
    """A (micro)batch's logits as the loss reads them: fp32 (the step's .float())."""
    return BYTES["fp32"] * tokens * vocabulary
