"""The GPT-style decoder in Keras (what it is: trainscale.core.gpt), layer for
layer trainscale.frameworks.torch.torch_gpt's, with its variables in the same order:
a Dense kernel is a torch Linear weight transposed, and nothing else differs
(tests/torch/test_models.py copies one's weights into the other and compares
the logits).

Under a mixed-precision policy the attention's softmax and the layer norms
run in float32 (Keras's LayerNormalization does so itself), as torch's
autocast runs them.
"""

from __future__ import annotations

from trainscale.core.gpt import GPT_SHAPES, INIT_STDDEV, LAYER_NORM_EPSILON, MLP_RATIO


def _layers():
    import tensorflow as tf

    layers = tf.keras.layers

    class PositionEmbedding(layers.Layer):
        """Adds a learned (tokens x width) table to the token embeddings."""

        def __init__(self, seq_len: int, width: int, **kwargs):
            super().__init__(**kwargs)
            self.table = self.add_weight(
                name="embeddings",
                shape=(seq_len, width),
                initializer=tf.keras.initializers.RandomNormal(stddev=INIT_STDDEV),
            )

        def call(self, x):
            return x + tf.cast(self.table[: tf.shape(x)[1]], x.dtype)

    class CausalSelfAttention(layers.Layer):
        def __init__(self, width: int, head_width: int, **kwargs):
            super().__init__(**kwargs)
            self.width, self.head_width = width, head_width
            self.wq, self.wk, self.wv, self.wo = (
                _dense(width, name=name) for name in ("wq", "wk", "wv", "wo")
            )

        def call(self, x):
            batch, tokens = tf.shape(x)[0], tf.shape(x)[1]

            def heads(t):  # (batch, tokens, width) -> (batch, heads, tokens, head width)
                t = tf.reshape(t, (batch, tokens, -1, self.head_width))
                return tf.transpose(t, (0, 2, 1, 3))

            q, k, v = heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x))
            scores = tf.matmul(q, k, transpose_b=True) / self.head_width**0.5
            scores = tf.cast(scores, tf.float32)
            causal = tf.linalg.band_part(tf.ones((tokens, tokens), tf.bool), -1, 0)
            scores = tf.where(causal, scores, tf.constant(float("-inf")))
            weights = tf.cast(tf.nn.softmax(scores, axis=-1), v.dtype)
            y = tf.transpose(tf.matmul(weights, v), (0, 2, 1, 3))
            return self.wo(tf.reshape(y, (batch, tokens, self.width)))

    def _dense(units: int, **kwargs):
        return layers.Dense(
            units,
            kernel_initializer=tf.keras.initializers.RandomNormal(stddev=INIT_STDDEV),
            **kwargs,
        )

    return tf, layers, PositionEmbedding, CausalSelfAttention, _dense


def build_gpt(name: str, seq_len: int, vocabulary: int):
    """Model `name` from (batch, seq_len) int32 token ids to (batch, seq_len,
    vocabulary) logits."""
    tf, layers, PositionEmbedding, CausalSelfAttention, dense = _layers()
    shape = GPT_SHAPES[name]
    initializer = tf.keras.initializers.RandomNormal(stddev=INIT_STDDEV)
    tokens = layers.Input((seq_len,), dtype="int32")
    x = layers.Embedding(vocabulary, shape.width, embeddings_initializer=initializer,
                         name="embed")(tokens)  # fmt: skip
    x = PositionEmbedding(seq_len, shape.width, name="positions")(x)
    for i in range(shape.layers):
        norm = layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name=f"block{i}_attn_norm")
        x = x + CausalSelfAttention(shape.width, shape.head_width, name=f"block{i}_attn")(norm(x))
        hidden = layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name=f"block{i}_mlp_norm")(x)
        hidden = dense(MLP_RATIO * shape.width, name=f"block{i}_fc")(hidden)
        hidden = tf.keras.activations.gelu(hidden, approximate=True)
        x = x + dense(shape.width, name=f"block{i}_proj")(hidden)
    x = layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name="norm")(x)
    logits = dense(vocabulary, use_bias=False, name="head")(x)
    return tf.keras.Model(tokens, logits, name=name)
