"""The GPT-style decoder in torch (what it is: trainscale.core.gpt).

Laid out for the ways torch distributes it:
- the blocks are an nn.ModuleDict keyed "0", "1", ...: a pipeline stage keeps
  its blocks and drops the others, and every parameter keeps its name
  (torchtitan's layout);
- a stage without the embeddings, or without the final norm and head, has
  them set to None and passes its input through (forward);
- attention reshapes by head width, never by head count, so a tensor-parallel
  rank that holds some of the heads runs the same code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainscale.core.gpt import (
    GPT_SHAPES,
    INIT_STDDEV,
    LAYER_NORM_EPSILON,
    MLP_RATIO,
    stage_blocks,
)


class Attention(nn.Module):
    def __init__(self, width: int, head_width: int):
        super().__init__()
        self.head_width = head_width
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(width, width) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = (
            w(x).view(batch, tokens, -1, self.head_width).transpose(1, 2)
            for w in (self.wq, self.wk, self.wv)
        )
        # Flash or memory-efficient attention where the device has one.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(batch, tokens, -1))


class Mlp(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, MLP_RATIO * width)
        self.proj = nn.Linear(MLP_RATIO * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, width: int, head_width: int):
        super().__init__()
        self.attention_norm = nn.LayerNorm(width, eps=LAYER_NORM_EPSILON)
        self.attention = Attention(width, head_width)
        self.mlp_norm = nn.LayerNorm(width, eps=LAYER_NORM_EPSILON)
        self.mlp = Mlp(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Gpt(nn.Module):
    # --activation-checkpointing: each block's activations are recomputed in
    # backward instead of kept (set by the torch step, not a parameter).
    checkpoint_activations = False

    def __init__(self, name: str, seq_len: int, vocabulary: int):
        super().__init__()
        shape = GPT_SHAPES[name]
        self.embed = nn.Embedding(vocabulary, shape.width)
        self.positions = nn.Embedding(seq_len, shape.width)
        self.blocks = nn.ModuleDict(
            {str(i): Block(shape.width, shape.head_width) for i in range(shape.layers)}
        )
        self.norm = nn.LayerNorm(shape.width, eps=LAYER_NORM_EPSILON)
        self.head = nn.Linear(shape.width, vocabulary, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=INIT_STDDEV)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, tokens) to logits (batch, tokens, vocabulary); a
        pipeline stage's activations in between."""
        if self.embed is not None:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.embed(x) + self.positions(positions)
        for block in self.blocks.values():
            if self.checkpoint_activations and torch.is_grad_enabled():
                # Recomputed in backward rather than kept (torchtitan's
                # per-block "full" activation checkpointing).
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.head is not None:
            x = self.head(x)
        return x


def keep_stage(model: Gpt, stage: int, stages: int) -> Gpt:
    """Cut the whole model down to pipeline stage `stage` of `stages`: its
    blocks, with the embeddings on the first stage and the norm and head on
    the last. Every kept parameter keeps its name and its initial value."""
    mine = {str(i) for i in stage_blocks(len(model.blocks), stage, stages)}
    for key in [key for key in model.blocks if key not in mine]:
        del model.blocks[key]
    if stage != 0:
        model.embed = model.positions = None
    if stage != stages - 1:
        model.norm = model.head = None
    return model
