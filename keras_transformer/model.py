"""§3.1 Encoder and Decoder Stacks: the Transformer model (Figure 1).

    source ids ─ embedding·√d_model + PE ─ dropout ─ N × EncoderBlock ─┐
    target ids ─ embedding·√d_model + PE ─ dropout ─ N × DecoderBlock ─┴─ Eᵀ ─ logits

`Transformer.encode` runs the encoder once; `Transformer.decode` runs the decoder,
either over a whole (shifted-right) target for training or step by step with a
key/value cache for decoding. Calling the model does both.
"""

import keras
from keras import ops

from keras_transformer import backend, compat, id_checks
from keras_transformer.chunked_loss import ChunkedLossModel
from keras_transformer.config import TransformerConfig
from keras_transformer.layers.blocks import DecoderBlock, EncoderBlock
from keras_transformer.layers.embedding import (
    LearnedPositionEmbedding,
    SinusoidalPositionEncoding,
    TokenEmbedding,
)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(id_checks.IdCheckedModel, ChunkedLossModel, keras.Model):
    """The encoder-decoder Transformer of "Attention Is All You Need".

    All weights are created when the model is constructed, so
    `Transformer(config).count_params()` works at once and a saved model loads
    under any backend. Ids are checked where they enter (calls, `fit`,
    `evaluate`, `predict`: `keras_transformer.id_checks.IdCheckedModel`).

    Args:
        config: A `TransformerConfig` (or its dict form).
        **kwargs: Base model arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: A dict with "source", (batch, S) int ids, and "target", (batch, T)
            int ids of the decoder input (already shifted right). Id
            `config.pad_id` is padding and is masked everywhere.
        training: Whether dropout is active.

    Returns:
        (batch, T, target_vocab_size) float32 logits.

    Example:

    >>> config = TransformerConfig.tiny(vocab_size=20)
    >>> model = Transformer(config)
    >>> logits = model({"source": keras.ops.ones((2, 7), "int32"),
    ...                 "target": keras.ops.ones((2, 5), "int32")})
    >>> tuple(logits.shape)
    (2, 5, 20)

    References:
        Vaswani et al., "Attention Is All You Need", NeurIPS 2017.
    """

    def __init__(self, config, **kwargs):
        if isinstance(config, dict):
            config = TransformerConfig.from_dict(config)
        if not isinstance(config, TransformerConfig):
            raise TypeError(
                f"config must be a TransformerConfig, got {type(config).__name__}: "
                "build one with TransformerConfig.base(vocab_size=...)."
            )
        super().__init__(**kwargs)
        self._config = config
        self._make_embeddings(config)
        self._make_stacks(config)
        self.build()

    def _make_embeddings(self, c):
        """§3.4 the token embeddings (shared, or one per side) and the pre-softmax
        projection (tied to the target embeddings, or its own); §3.5 the
        positions; the dropout on their sums."""
        policy = self.dtype_policy
        tied_output = c.tie_output_embedding
        self.source_embedding = TokenEmbedding(
            c.vocab_size, c.d_model, use_output_bias=tied_output and c.share_embeddings,
            dtype=policy, name="shared_embedding" if c.share_embeddings else "source_embedding")
        self.target_embedding = self.source_embedding
        if not c.share_embeddings:
            self.target_embedding = TokenEmbedding(
                c.resolved_target_vocab_size, c.d_model, use_output_bias=tied_output,
                dtype=policy, name="target_embedding")
        self.output_projection = None
        if not tied_output:
            self.output_projection = keras.layers.Dense(
                c.resolved_target_vocab_size, dtype=policy, name="output_projection")
        if c.position_encoding == "learned":
            self.source_position = LearnedPositionEmbedding(
                c.max_length, dtype=policy, name="source_position_embedding")
            self.target_position = LearnedPositionEmbedding(
                c.max_length, dtype=policy, name="target_position_embedding")
        else:
            self.source_position = SinusoidalPositionEncoding(dtype=policy,
                                                              name="position_encoding")
            self.target_position = self.source_position
        self.embedding_dropout = keras.layers.Dropout(c.dropout_rate, dtype=policy,
                                                      name="embedding_dropout")

    def _make_stacks(self, c):
        """§3.1 the N encoder and N decoder blocks, and the final LayerNorm of a
        pre-norm stack (post-norm blocks already end in one)."""
        policy = self.dtype_policy
        block_args = dict(
            num_heads=c.num_heads, d_ff=c.d_ff, key_dim=c.resolved_key_dim,
            value_dim=c.resolved_value_dim, dropout_rate=c.dropout_rate,
            attention_dropout_rate=c.attention_dropout_rate,
            activation_dropout_rate=c.activation_dropout_rate,
            norm_position=c.norm_position, layer_norm_epsilon=c.layer_norm_epsilon,
            dtype=policy)
        self.encoder_blocks = [EncoderBlock(**block_args, name=f"encoder_block_{i}")
                               for i in range(c.num_layers)]
        self.decoder_blocks = [DecoderBlock(**block_args, name=f"decoder_block_{i}")
                               for i in range(c.num_layers)]
        self.encoder_norm = self.decoder_norm = None
        if c.norm_position == "pre":
            self.encoder_norm = keras.layers.LayerNormalization(
                epsilon=c.layer_norm_epsilon, dtype=policy, name="encoder_norm")
            self.decoder_norm = keras.layers.LayerNormalization(
                epsilon=c.layer_norm_epsilon, dtype=policy, name="decoder_norm")

    @staticmethod
    def get_layout_map(device_mesh):
        """A `keras.distribution.LayoutMap` that splits the model's large
        weights along the mesh's "model" axis, for
        `keras.distribution.ModelParallel` (variable paths as regexes):

        - token embeddings (vocab, d_model) and the output bias: by vocabulary rows;
        - attention query/key/value kernels (d_model, h, d_k) and biases: by heads;
          the output projection (h, d_v, d_model): by heads;
        - feed-forward inner kernel (d_model, d_ff) and bias: by d_ff columns; the
          outer kernel (d_ff, d_model): by d_ff rows.

        A dimension must divide by the model axis size (h, d_ff and the vocabulary
        size usually do); layer norms and the other biases stay replicated.
        """
        layout_map = keras.distribution.LayoutMap(device_mesh)
        layout_map[r".*embeddings"] = ("model", None)
        layout_map[r".*output_bias"] = ("model",)
        layout_map[r".*attention/(query|key|value)/kernel"] = (None, "model", None)
        layout_map[r".*attention/(query|key|value)/bias"] = ("model", None)
        layout_map[r".*attention/attention_output/kernel"] = ("model", None, None)
        layout_map[r".*feed_forward/inner_dense/kernel"] = (None, "model")
        layout_map[r".*feed_forward/inner_dense/bias"] = ("model",)
        layout_map[r".*feed_forward/output_dense/kernel"] = ("model", None)
        return layout_map

    @property
    def config(self):
        """The model's `TransformerConfig`."""
        return self._config

    def build(self, input_shape=None):
        if self.built:
            return
        hidden = (None, None, self._config.d_model)
        shapes = [
            (self.source_embedding, ()),
            (self.target_embedding, ()),
            (self.output_projection, (hidden,)),
            (self.source_position, (hidden,)),
            (self.target_position, (hidden,)),
            (self.encoder_norm, (hidden,)),
            (self.decoder_norm, (hidden,)),
            *[(block, (hidden,)) for block in self.encoder_blocks],
            *[(block, (hidden, hidden)) for block in self.decoder_blocks],
        ]
        # Shared layers appear twice; build each once.
        for layer, layer_shapes in shapes:
            if layer is not None and not layer.built:
                layer.build(*layer_shapes)
        self.built = True

    def padding_mask(self, token_ids):
        """(batch, length) bool mask, True where `token_ids` is not padding."""
        return ops.not_equal(token_ids, self._config.pad_id)

    def encode(self, source_ids, training=None):
        """Runs the encoder stack.

        Args:
            source_ids: (batch, S) int ids.
            training: Whether dropout is active.

        Returns:
            `(encoder_outputs, source_padding_mask)`: (batch, S, d_model) and
            (batch, S) bool.
        """
        source_mask = self.padding_mask(source_ids)
        x = backend.call_part(self.source_embedding, source_ids)
        x = backend.call_part(self.embedding_dropout,
                              x + backend.call_part(self.source_position, x), training=training)
        for block in self.encoder_blocks:
            x = backend.call_part(block, x, padding_mask=source_mask, training=training)
        if self.encoder_norm is not None:
            x = backend.call_part(self.encoder_norm, x)
        return x, source_mask

    def initial_cache(self, encoder_outputs, max_length, beam_size=1):
        """The key/value cache of incremental decoding (§6.1), for one batch.

        The one description of the cache layout: a dict with

        * "self": one `(keys, values)` pair per decoder block, the causal
          self-attention's keys and values of the positions decoded so far,
          (batch, max_length, num_heads * key_dim) and (batch, max_length,
          num_heads * value_dim), zeros until written;
        * "cross": one `(keys, values)` pair per decoder block, the
          encoder-decoder attention's projections of `encoder_outputs`,
          (batch, S, num_heads * key_dim) and (batch, S, num_heads *
          value_dim), computed here once and read at every step.
        * "reverse_kernel", under JAX and TensorFlow with the output
          projection tied to the target embeddings: that projection's
          (d_model, target vocab) matrix, `TokenEmbedding.reverse_kernel()`,
          made here once for every step to read
          (`keras_transformer.backend.copy_reverse_kernel` says why).

        With `beam_size` k > 1 (beam search), the self-attention caches have
        batch * k rows, the hypotheses of sentence b at rows b * k ... b * k +
        k - 1, and the cross-attention caches keep one row per sentence, which
        its k rows share: `decode` then takes batch * k target rows and the
        (batch, S) source mask.

        The heads lie side by side in the last axis, as the decoding step
        reads them (`MultiHeadAttention.initial_cache` says why).

        Keys and values are separate tensors, so d_k and d_v may differ (Table
        3, row B).

        Args:
            encoder_outputs: (batch, S, d_model) from `encode`.
            max_length: Positions the self-attention caches have room for: the
                decoder input's length, BOS included.
            beam_size: Decoder rows per sentence, sharing its cross-attention
                rows.

        Returns:
            The cache dict, for `decode(..., cache=..., cache_update_index=...)`.
        """
        caches = [block.initial_cache(encoder_outputs, max_length, beam_size)
                  for block in self.decoder_blocks]
        cache = {"self": [c["self"] for c in caches], "cross": [c["cross"] for c in caches]}
        if self.output_projection is None and backend.copy_reverse_kernel():
            cache["reverse_kernel"] = self.target_embedding.reverse_kernel()
        return cache

    def reorder_cache(self, cache, indices):
        """The cache with its rows taken at `indices` (beam search, §6.1).

        Args:
            cache: A cache from `initial_cache` or `decode`.
            indices: (batch,) int rows: row i of the result is row indices[i].
                Only the self-attention caches are taken; the cross-attention
                caches must already hold the same source on the rows that swap,
                as the beams of one sentence do.

        Returns:
            The reordered cache.
        """
        taken = [tuple(ops.take(part, indices, axis=0) for part in pair)
                 for pair in cache["self"]]
        return {**cache, "self": taken}

    def grow_cache(self, cache, max_length):
        """The cache with room for `max_length` positions (§6.1).

        The decoding loops start with a small self-attention cache and grow it
        as the hypotheses do (`keras_transformer.inference.step.cache_phases`),
        since a step's cost follows the cache's size.

        Args:
            cache: A cache from `initial_cache` or `decode`.
            max_length: The new room, at least the present one; the new
                positions are zeros until written.

        Returns:
            The cache with every self-attention pair padded to `max_length`
            positions (its other parts as they were).
        """
        def grow(part):
            extra = max_length - ops.shape(part)[1]
            return ops.pad(part, [(0, 0), (0, extra), (0, 0)])

        grown = [tuple(grow(part) for part in pair) for pair in cache["self"]]
        return {**cache, "self": grown}

    def decode(
        self,
        target_ids,
        encoder_outputs,
        source_padding_mask=None,
        cache=None,
        cache_update_index=None,
        training=None,
    ):
        """Runs the decoder stack and the pre-softmax projection.

        Args:
            target_ids: (batch, T) int ids of the decoder input, padded on the
                right (the logits of padded positions are not meaningful).
            encoder_outputs: (batch, S, d_model) from `encode`; not read with a
                cache, which holds its keys and values (None may be passed).
            source_padding_mask: (batch, S) bool from `encode`.
            cache: None to decode the whole target at once (training), or the
                cache from `initial_cache` / a previous step to decode `target_ids`
                as the positions starting at `cache_update_index`: the cached
                decoding step that greedy and beam search, the SavedModel and
                the tests all run.
            cache_update_index: int scalar, the position of `target_ids[:, 0]`.
            training: Whether dropout is active.

        Returns:
            (batch, T, target_vocab_size) float32 logits; with a cache, the pair
            `(logits, updated_cache)`.
        """
        if cache is not None and cache_update_index is None:
            raise ValueError("decode() with a cache needs cache_update_index.")
        start_index = 0 if cache_update_index is None else cache_update_index
        x = backend.call_part(self.target_embedding, target_ids)
        x = x + backend.call_part(self.target_position, x, start_index=start_index)
        x = backend.call_part(self.embedding_dropout, x, training=training)
        if cache is None:
            # Targets are padded on the right: causality alone (the backends'
            # causal kernel) keeps each real position from the padding after
            # it, and the loss and metrics ignore the padded positions' logits.
            for block in self.decoder_blocks:
                x = backend.call_part(block, x, encoder_outputs,
                                      encoder_padding_mask=source_padding_mask,
                                      training=training)
            if self.states_for_loss():  # a chunked loss projects them (ChunkedLossModel)
                return x if self.decoder_norm is None else backend.call_part(self.decoder_norm, x)
            return self.project_outputs(x)
        self_caches = []
        for block, self_cache, cross_cache in zip(self.decoder_blocks, cache["self"],
                                                  cache["cross"]):
            x, self_cache = backend.call_part(
                block, x, encoder_outputs, encoder_padding_mask=source_padding_mask,
                self_attention_cache=self_cache, cache_update_index=cache_update_index,
                cross_attention_cache=cross_cache, training=training)
            self_caches.append(self_cache)
        logits = self.project_outputs(x, reverse_kernel=cache.get("reverse_kernel"))
        return logits, {**cache, "self": self_caches}

    def attention_weights(self, source_ids, target_ids):
        """Every attention's weights of eq. (1), for a source and a whole
        (shifted-right) target, as the paper's figures draw them.

        Args:
            source_ids: (batch, S) int ids.
            target_ids: (batch, T) int ids of the decoder input.

        Returns:
            A dict of lists, one item per block: "encoder", (batch, num_heads,
            S, S); "decoder", the causal self-attention's (batch, num_heads, T,
            T); "cross", the encoder-decoder attention's (batch, num_heads, T,
            S). float32.
        """
        source_mask = self.padding_mask(source_ids)
        target_mask = self.padding_mask(target_ids)
        weights = {"encoder": [], "decoder": [], "cross": []}
        x = self.source_embedding(source_ids)
        x = x + self.source_position(x)
        for block in self.encoder_blocks:
            weights["encoder"].append(block.attention_weights(x, padding_mask=source_mask))
            x = block(x, padding_mask=source_mask)
        encoded = x if self.encoder_norm is None else self.encoder_norm(x)
        x = self.target_embedding(target_ids)
        x = x + self.target_position(x)
        for block in self.decoder_blocks:
            block_weights = block.attention_weights(x, encoded, decoder_padding_mask=target_mask,
                                                    encoder_padding_mask=source_mask)
            weights["decoder"].append(block_weights["self"])
            weights["cross"].append(block_weights["cross"])
            x = block(x, encoded, decoder_padding_mask=target_mask,
                      encoder_padding_mask=source_mask)
        return weights

    def project_outputs(self, decoder_outputs, reverse_kernel=None):
        """The decoder stack's last LayerNorm (pre-norm only) and the pre-softmax
        projection (§3.4): (batch, T, d_model) → (batch, T, vocab) float32 logits.

        With the projection tied to the embeddings, `reverse_kernel` may give
        its matrix made beforehand (the cache's "reverse_kernel")."""
        x = decoder_outputs
        if self.decoder_norm is not None:
            x = backend.call_part(self.decoder_norm, x)
        if self.output_projection is None:
            return backend.call_part(self.target_embedding, x, reverse=True,
                                     reverse_kernel=reverse_kernel)
        return ops.cast(backend.call_part(self.output_projection, x), "float32")

    def output_projection_weights(self):
        """The pre-softmax projection as (d_model, vocab) kernel in the compute dtype
        and (vocab,) float32 bias (None without one), for a chunked loss."""
        layer = self.output_projection
        if layer is None:
            layer = self.target_embedding
            kernel, bias = layer.reverse_kernel(), layer.output_bias
        else:
            kernel, bias = ops.cast(layer.kernel, self.compute_dtype), layer.bias
        return kernel, None if bias is None else ops.cast(bias, "float32")

    def compile(self, *args, jit_compile="auto", **kwargs):
        """`keras.Model.compile`, with XLA also for TensorFlow on a CPU.

        With `jit_compile="auto"`, XLA is on wherever Keras would turn it on,
        and also for TensorFlow on a CPU, where it is faster for this model
        (`keras_transformer.backend.use_xla_for_training`). Pass
        `jit_compile=False` (or True) to choose.
        """
        if jit_compile == "auto" and backend.use_xla_for_training(self):
            jit_compile = True
        super().compile(*args, jit_compile=jit_compile, **kwargs)

    def compile_from_config(self, config):
        """Compiles a model that `keras.saving.load_model` loads, as it was saved (Keras
        skips any model whose `compile` is overridden), with this backend's optimizer
        whichever backend saved it (`compat.neutral_config`)."""
        self.compile(**keras.saving.deserialize_keras_object(compat.neutral_config(config)))
        if self.optimizer is not None and self.built:
            self.optimizer.build(self.trainable_variables)  # its variables, for the weights

    def _vocab_sizes(self):
        """What `id_checks.IdCheckedModel` checks ids against."""
        c = self._config
        return {"source": c.vocab_size, "target": c.resolved_target_vocab_size,
                "labels": c.resolved_target_vocab_size}

    def call(self, inputs, training=None):
        source_ids, target_ids = id_checks.split_inputs(inputs)
        encoder_outputs, source_mask = self.encode(source_ids, training=training)
        return self.decode(target_ids, encoder_outputs, source_mask, training=training)

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
            "config": self._config.to_dict(),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        return cls(TransformerConfig.from_dict(config.pop("config")), **config)
