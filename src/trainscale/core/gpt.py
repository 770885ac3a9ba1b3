"""trainscale's text models: a GPT-style decoder's size ladder, its parameter
count and its training FLOPs per token. Pure: no TensorFlow, no torch.

The network (trainscale.frameworks.torch.torch_gpt and trainscale.frameworks.tensorflow.keras_gpt
build it, the same parameter for parameter):

- a token embedding (vocabulary x width) plus a learned position embedding
  (sequence length x width);
- `layers` pre-norm blocks, each x + attention(norm(x)), then
  x + mlp(norm(x)): causal multi-head self-attention with separate query,
  key, value and output projections (width x width, with biases), and an MLP
  of width -> 4 x width -> width with GELU (its tanh form, GPT-2's);
- a final layer norm (epsilon 1e-5 everywhere, GPT-2's) and an output head
  (width x vocabulary, no bias).

The head is **untied** from the token embedding (GPT-2 ties them): a pipeline
puts the embedding on its first stage and the head on its last, and a tied
weight would have to be kept equal across two ranks (torchtitan's Llama is
untied for the same reason). So GPT-2 small's shape has 163 M parameters
here at 1,024 positions and 50,257 tokens, 124 M plus a second 38.6 M
vocabulary matrix. There is no dropout: a benchmark's step is the same
without it, and the two ecosystems' random streams could not match.
Weights start from N(0, 0.02) (GPT-2's), biases at zero.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The vocabulary of GPT-2's byte-pair encoding: the default on synthetic tokens.
GPT2_VOCABULARY = 50_257
INIT_STDDEV = 0.02
LAYER_NORM_EPSILON = 1e-5
MLP_RATIO = 4


@dataclass(frozen=True)
class GptShape:
    layers: int
    heads: int
    width: int  # the model dimension; heads x head width
    context: int  # the sequence length a run takes when --seq-len is 0

    @property
    def head_width(self) -> int:
        return self.width // self.heads


# The ladder: two small shapes for CPUs (tests, the demo, the CPU memory
# study), then GPT-2's four (Radford et al. 2019, table 2) for clusters.
GPT_SHAPES = {
    "gpt-tiny": GptShape(layers=2, heads=2, width=64, context=64),
    "gpt-mini": GptShape(layers=4, heads=4, width=256, context=128),
    "gpt2-small": GptShape(layers=12, heads=12, width=768, context=1024),
    "gpt2-medium": GptShape(layers=24, heads=16, width=1024, context=1024),
    "gpt2-large": GptShape(layers=36, heads=20, width=1280, context=1024),
    "gpt2-xl": GptShape(layers=48, heads=25, width=1600, context=1024),
}
TEXT_MODELS = tuple(GPT_SHAPES)

# A shape that is not on the ladder, for the analyses that only count (the
# parameters, the FLOPs, the memory; `trainscale plan`): BERT's notation
# (Devlin et al. 2019), L layers, H the hidden width, A attention heads.
SHAPE_PATTERN = re.compile(r"L(\d+)-H(\d+)-A(\d+)")


def gpt_shape(name: str) -> GptShape:
    """The shape of a ladder model, or of a shape written `L48-H1600-A25`
    (its context 0: the caller gives the sequence length). A ValueError
    names both forms for anything else."""
    if name in GPT_SHAPES:
        return GPT_SHAPES[name]
    found = SHAPE_PATTERN.fullmatch(name)
    if not found:
        raise ValueError(
            f"{name!r} is neither a ladder model ({', '.join(GPT_SHAPES)}) nor a shape "
            "written L<layers>-H<hidden>-A<heads> (e.g. L48-H1600-A25)"
        )
    layers, width, heads = map(int, found.groups())
    if min(layers, width, heads) < 1 or width % heads:
        raise ValueError(f"{name}: layers, hidden, heads positive, heads dividing hidden")
    return GptShape(layers=layers, heads=heads, width=width, context=0)


def block_parameters(shape: GptShape) -> int:
    """One block: two layer norms, four attention projections, the MLP."""
    e, hidden = shape.width, MLP_RATIO * shape.width
    return 2 * 2 * e + 4 * (e * e + e) + (e * hidden + hidden) + (hidden * e + e)


def embedding_parameters(shape: GptShape, seq_len: int, vocabulary: int) -> int:
    """The two lookup tables, token and position: no multiply-adds."""
    return vocabulary * shape.width + seq_len * shape.width


def parameter_count(name: str, seq_len: int, vocabulary: int) -> int:
    """Every trainable number of model `name` (a ladder name or a shape,
    gpt_shape) at this sequence length and vocabulary."""
    shape = gpt_shape(name)
    return (
        embedding_parameters(shape, seq_len, vocabulary)
        + shape.layers * block_parameters(shape)
        + 2 * shape.width  # the final layer norm
        + shape.width * vocabulary  # the head
    )


def training_flops_per_token(name: str, seq_len: int, vocabulary: int) -> int:
    """6 N + 12 L H Q T, as PaLM's appendix B and torchtitan count a training
    step's FLOPs per token: N the parameters that multiply (the embedding
    tables are lookups and are left out, as torchtitan leaves them out), a
    forward and a backward of two passes each, 3 x 2 FLOPs per weight; and
    the attention's two T x T products per layer (scores and the weighted
    sum), counted in full although the causal mask makes half of them zero."""
    return stage_training_flops_per_token(name, seq_len, vocabulary, 0, 1)


def stage_training_flops_per_token(
    name: str, seq_len: int, vocabulary: int, stage: int, stages: int
) -> int:
    """training_flops_per_token's count for pipeline stage `stage` of
    `stages` (stage_blocks): its blocks, and the final norm and the head on
    the last stage; the stages' counts add up to the model's."""
    shape = gpt_shape(name)
    blocks = len(stage_blocks(shape.layers, stage, stages))
    dense = blocks * block_parameters(shape)
    if stage == stages - 1:
        dense += 2 * shape.width + shape.width * vocabulary  # the final norm and the head
    return 6 * dense + 12 * blocks * shape.width * seq_len


def stage_blocks(layers: int, stage: int, stages: int) -> range:
    """The blocks pipeline stage `stage` of `stages` holds: a run of
    consecutive ones, the first stages one more where they do not split evenly."""
    per, extra = divmod(layers, stages)
    first = stage * per + min(stage, extra)
    return range(first, first + per + (stage < extra))
