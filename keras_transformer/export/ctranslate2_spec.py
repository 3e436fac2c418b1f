"""§3 in CTranslate2's terms: a `Transformer` mapped onto `ctranslate2.specs.TransformerSpec`.

The converter `keras_transformer.export.ctranslate2` writes what this module fills.
Every detail that changes outputs is set explicitly rather than left to
CTranslate2's defaults:

* §3.1: post-norm blocks (`pre_norm=False`), or pre-norm with a final LayerNorm
  on each stack; LayerNorm epsilon `config.layer_norm_epsilon`.
* §3.2: d_k = d_v per head (`head_dim` when h · d_k ≠ d_model), queries scaled
  by 1/√d_k (CTranslate2's default); query, key and value projections fused.
* §3.3: ReLU.
* §3.4: embeddings multiplied by √d_model; shared source/target embeddings and
  the tied pre-softmax projection become one weight (CTranslate2 aliases equal
  weights); the projection's bias is the model's output bias.
* §3.5: CTranslate2's built-in sinusoids concatenate sines and cosines and
  count positions from 1, where §3.5 (and `sinusoidal_position_encoding`)
  interleaves them from 0. The encoding is therefore written out as a table of
  `source_limit(config) + LENGTH_OFFSET` rows, enough for the longest input and
  output our decoding allows; learned positions (Table 3 row E) are their
  tables.
* Special ids: CTranslate2 names its special tokens by string. `unk_token`,
  `bos_token` (= `decoder_start_token`, so decoding starts with our BOS as
  `beam_search` does) and `eos_token` are the tokenizer's own strings at
  `unk_id`, `bos_id` and `eos_id`, and `add_source_eos` appends EOS to the
  source as `Translator.source_ids` does. Our search never generates padding or
  BOS; the converter gives both a pre-softmax bias of -65504 (the float16
  minimum, held by every compute type), so CTranslate2 never does either.

With these, `translate_batch` on the source's token strings, with
`beam_size=1`, `min_decoding_length=0` (CTranslate2's default 1 forbids an
immediate EOS, ours does not) and `max_decoding_length` = source tokens + EOS +
50 (§6.1), returns our greedy ids; `return_end_token=True` includes the EOS our
ids end with. Beam search matches ours for α = 0 (`length_penalty=0`); with a
length penalty CTranslate2 divides by |Y|^α where §6.1 (Wu et al.) divides by
((5 + |Y|) / 6)^α, so `CTranslate2Model` reranks its finished hypotheses by
§6.1's score. Scores differ slightly from ours: our search removes padding and
BOS after the softmax, CTranslate2 before it.

The conversion reads weights only, so it runs under any Keras backend.
"""

import collections

import numpy as np

from keras_transformer.inference.limits import LENGTH_OFFSET, source_limit

__all__ = ["import_ctranslate2", "transformer_spec"]

# The pre-softmax bias of ids the search must never produce (padding, BOS): the
# most negative float16, so that it stays finite in every compute type.
_NEVER = float(np.finfo(np.float16).min)


def import_ctranslate2():
    """The `ctranslate2` package with its specs, or an ImportError saying how to
    install it."""
    try:
        import ctranslate2
        import ctranslate2.specs  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"Exporting to CTranslate2 needs the ctranslate2 package ({error}): install it "
            "with `pip install ctranslate2` or `pip install keras-transformer[serving]`."
        ) from error
    return ctranslate2


def transformer_spec(model, source_tokenizer, target_tokenizer):
    """The `ctranslate2.specs.TransformerSpec` of a `Transformer`, filled with
    its weights and vocabularies (not yet validated, optimized or saved).

    Raises:
        ValueError: for a model CTranslate2 cannot express (d_k ≠ d_v), or
            tokenizers whose special tokens do not fit CTranslate2's
            conventions.
    """
    ctranslate2 = import_ctranslate2()
    specs = ctranslate2.specs
    config = model.config
    key_dim, value_dim = config.resolved_key_dim, config.resolved_value_dim
    if key_dim != value_dim:
        raise ValueError(
            f"CTranslate2 has one width per attention head, but the model has key_dim={key_dim} "
            f"and value_dim={value_dim} (Table 3 row B): export it with --format saved_model."
        )
    head_dim = None if key_dim * config.num_heads == config.d_model else key_dim
    pre_norm = config.norm_position == "pre"
    relu = specs.Activation.RELU
    encoder = specs.TransformerEncoderSpec(config.num_layers, config.num_heads,
                                           pre_norm=pre_norm, activation=relu,
                                           head_dim=head_dim)
    decoder = specs.TransformerDecoderSpec(config.num_layers, config.num_heads,
                                           pre_norm=pre_norm, activation=relu,
                                           head_dim=head_dim)
    spec = specs.TransformerSpec(encoder, decoder)

    rows = source_limit(config) + LENGTH_OFFSET
    _set_stack_inputs(encoder, model.source_embedding, model.source_position, rows, config)
    _set_stack_inputs(decoder, model.target_embedding, model.target_position, rows, config)
    for layer_spec, block in zip(encoder.layer, model.encoder_blocks):
        _set_attention(layer_spec.self_attention, block.self_attention, block.self_attention_norm,
                       fused=True)
        _set_feed_forward(layer_spec.ffn, block.feed_forward, block.feed_forward_norm)
    for layer_spec, block in zip(decoder.layer, model.decoder_blocks):
        _set_attention(layer_spec.self_attention, block.self_attention, block.self_attention_norm,
                       fused=True)
        _set_attention(layer_spec.attention, block.cross_attention, block.cross_attention_norm,
                       fused=False)
        _set_feed_forward(layer_spec.ffn, block.feed_forward, block.feed_forward_norm)
    if pre_norm:
        _set_layer_norm(encoder.layer_norm, model.encoder_norm)
        _set_layer_norm(decoder.layer_norm, model.decoder_norm)
    _set_projection(decoder.projection, model, target_tokenizer)

    source_tokens = _vocabulary(source_tokenizer, config.vocab_size, "source")
    target_tokens = _vocabulary(target_tokenizer, config.resolved_target_vocab_size, "target")
    tokens = _special_tokens((source_tokenizer, source_tokens),
                             (target_tokenizer, target_tokens))
    spec.config.unk_token = tokens["unk"]
    spec.config.bos_token = tokens["bos"]
    spec.config.eos_token = tokens["eos"]
    spec.config.decoder_start_token = tokens["bos"]
    spec.config.add_source_bos = False
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = float(config.layer_norm_epsilon)
    spec.register_source_vocabulary(source_tokens)
    spec.register_target_vocabulary(target_tokens)
    return spec


# The weights, layer by layer. Keras kernels are (inputs, outputs); CTranslate2
# linear weights are (outputs, inputs).


def _numpy(variable):
    import keras

    return np.asarray(keras.ops.convert_to_numpy(variable), dtype=np.float32)


def _set_linear(spec, kernel, bias):
    spec.weight = np.ascontiguousarray(kernel.T)
    spec.bias = bias


def _set_layer_norm(spec, norm):
    spec.gamma = _numpy(norm.gamma)
    spec.beta = _numpy(norm.beta)


def _set_stack_inputs(spec, embedding, position, rows, config):
    """§3.4 scaled embeddings and §3.5 positions of one stack."""
    from keras_transformer.layers.embedding import sinusoidal_position_encoding

    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _numpy(embedding.embeddings)
    spec.scale_embeddings = True  # × √d_model
    if config.position_encoding == "learned":
        spec.position_encodings.encodings = _numpy(position.position_embeddings)
    else:
        spec.position_encodings.encodings = _numpy(
            sinusoidal_position_encoding(rows, config.d_model))


def _set_attention(spec, attention, norm, fused):
    """§3.2.2: the query, key and value projections (fused as CTranslate2 wants:
    all three for self-attention, keys and values for encoder-decoder
    attention), the output projection and the sublayer's LayerNorm."""
    def projection(dense):
        kernel = _numpy(dense.kernel)  # (d_model, heads, head_dim)
        return kernel.reshape(kernel.shape[0], -1), _numpy(dense.bias).reshape(-1)

    parts = [projection(attention.query_dense), projection(attention.key_dense),
             projection(attention.value_dense)]
    groups = [parts] if fused else [parts[:1], parts[1:]]
    for linear, group in zip(spec.linear, groups):
        _set_linear(linear, np.concatenate([kernel for kernel, _ in group], axis=1),
                    np.concatenate([bias for _, bias in group]))
    output = _numpy(attention.output_dense.kernel)  # (heads, head_dim, d_model)
    _set_linear(spec.linear[-1], output.reshape(-1, output.shape[-1]),
                _numpy(attention.output_dense.bias))
    _set_layer_norm(spec.layer_norm, norm)


def _set_feed_forward(spec, feed_forward, norm):
    """§3.3: FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, with its sublayer's LayerNorm."""
    for linear, dense in ((spec.linear_0, feed_forward.inner_dense),
                          (spec.linear_1, feed_forward.output_dense)):
        _set_linear(linear, _numpy(dense.kernel), _numpy(dense.bias))
    _set_layer_norm(spec.layer_norm, norm)


def _set_projection(spec, model, target_tokenizer):
    """§3.4 pre-softmax linear transformation, tied or not, with padding and
    BOS made impossible as our search makes them."""
    if model.output_projection is None:
        embedding = model.target_embedding
        weight = _numpy(embedding.embeddings)
        bias = (np.zeros(weight.shape[0], np.float32) if embedding.output_bias is None
                else _numpy(embedding.output_bias))
    else:
        weight = _numpy(model.output_projection.kernel).T
        bias = _numpy(model.output_projection.bias)
    bias = bias.copy()
    bias[[model.config.pad_id, target_tokenizer.bos_id]] = _NEVER
    spec.weight = np.ascontiguousarray(weight)
    spec.bias = bias


# Vocabularies and special tokens.


def _vocabulary(tokenizer, model_vocab_size, side):
    """The token string of every id, padded to the model's vocabulary with
    placeholders for ids the tokenizer does not have."""
    if tokenizer.vocab_size > model_vocab_size:
        raise ValueError(
            f"The {side} tokenizer has {tokenizer.vocab_size} tokens but the model only "
            f"{model_vocab_size}: export the model with the tokenizer it was trained with.")
    layer = getattr(tokenizer, "layer", None)
    if layer is not None and hasattr(layer, "get_vocabulary"):
        tokens = [str(token) for token in layer.get_vocabulary()]
    elif hasattr(tokenizer, "id_to_token"):
        tokens = [str(tokenizer.id_to_token(i)) for i in range(tokenizer.vocab_size)]
    else:
        raise TypeError(
            f"The {side} tokenizer ({type(tokenizer).__name__}) gives no token strings: "
            "CTranslate2 needs `id_to_token(id)` (or `layer.get_vocabulary()`).")
    if len(tokens) != tokenizer.vocab_size:
        raise ValueError(
            f"The {side} tokenizer lists {len(tokens)} tokens but has vocab_size="
            f"{tokenizer.vocab_size}: its files do not belong together.")
    taken = set(tokens)
    if len(taken) != len(tokens):
        counts = collections.Counter(tokens)
        repeated = sorted(token for token, count in counts.items() if count > 1)[:5]
        raise ValueError(
            f"The {side} vocabulary repeats tokens ({repeated}): CTranslate2 finds ids by "
            "token string, so every token must be unique.")
    for token_id in range(len(tokens), model_vocab_size):
        placeholder = f"<keras_transformer_unused_{token_id}>"
        if placeholder in taken:
            raise ValueError(f"The {side} vocabulary already holds {placeholder!r}, the name "
                             f"given to id {token_id}, which the tokenizer does not have.")
        tokens.append(placeholder)
    return tokens


def _special_tokens(*sides):
    """unk, bos and eos as strings, the same on both sides (CTranslate2 has one
    name for each). `sides`: (tokenizer, token strings) pairs."""
    names = {}
    for name in ("unk", "bos", "eos"):
        found = set()
        for tokenizer, tokens in sides:
            token_id = getattr(tokenizer, f"{name}_id", None)
            if token_id is None:
                raise TypeError(f"{type(tokenizer).__name__} has no {name}_id: CTranslate2 "
                                "needs the unknown, begin and end tokens.")
            found.add(tokens[token_id])
        if len(found) != 1:
            raise ValueError(
                f"The source and target tokenizers name their {name} token differently "
                f"({sorted(found)}): CTranslate2 has one {name}_token for both vocabularies.")
        names[name] = found.pop()
    return names
