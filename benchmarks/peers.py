"""The peers our `Transformer` is timed against (§3 architecture, §5 training):
the same configuration built from keras-hub layers, and native PyTorch
`torch.nn.Transformer`.

Both mirror `TransformerConfig`: N post-norm encoder and decoder blocks,
h heads, d_ff, P_drop on sublayer outputs and embeddings, LayerNorm epsilon,
one embedding matrix shared by source, target and the output projection
(embeddings · √d_model, N(0, d_model^-0.5) initialisation), sinusoidal
positions, padding masks and a causal decoder mask. Differences that remain:
keras-hub's tied output projection has no bias (ours has a vocab-sized one),
and torch.nn.Transformer adds a final LayerNorm to each stack.
"""

import math


def build_keras_hub(config):
    """Our configuration from keras-hub layers, as a functional keras.Model."""
    import keras
    import keras_hub
    from keras import ops

    d = config.d_model
    source = keras.Input((None,), dtype="int32", name="source")
    target = keras.Input((None,), dtype="int32", name="target")
    embedding = keras_hub.layers.ReversibleEmbedding(
        config.vocab_size, d, tie_weights=True, name="shared_embedding",
        embeddings_initializer=keras.initializers.RandomNormal(stddev=d**-0.5))
    position = keras_hub.layers.SinePositionEncoding(name="position_encoding")
    dropout = keras.layers.Dropout(config.dropout_rate, name="embedding_dropout")

    def embed(ids):
        x = embedding(ids) * math.sqrt(d)
        return dropout(x + position(x))

    layer_args = {"intermediate_dim": config.d_ff, "num_heads": config.num_heads,
                  "dropout": config.dropout_rate,
                  "layer_norm_epsilon": config.layer_norm_epsilon}
    source_mask = ops.not_equal(source, config.pad_id)
    target_mask = ops.not_equal(target, config.pad_id)
    x = embed(source)
    for i in range(config.num_layers):
        x = keras_hub.layers.TransformerEncoder(**layer_args, name=f"encoder_{i}")(
            x, padding_mask=source_mask)
    y = embed(target)
    for i in range(config.num_layers):
        y = keras_hub.layers.TransformerDecoder(**layer_args, name=f"decoder_{i}")(
            y, x, decoder_padding_mask=target_mask, encoder_padding_mask=source_mask)
    logits = embedding(y, reverse=True)
    return keras.Model({"source": source, "target": target}, logits, name="keras_hub")


def torch_transformer(config):
    """Our configuration as a `torch.nn.Module` around `torch.nn.Transformer`:
    `module(source, target)` gives (batch, T, vocab) logits. A row that is all
    padding attends to every key, as ours does, so that both models compute the
    same thing on the padding row of gpu.py's batches."""
    import numpy as np
    import torch

    d, V = config.d_model, config.vocab_size

    class TorchTransformer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(V, d)
            torch.nn.init.normal_(self.embedding.weight, std=d**-0.5)
            self.output_bias = torch.nn.Parameter(torch.zeros(V))
            self.dropout = torch.nn.Dropout(config.dropout_rate)
            position = np.arange(config.max_length)[:, None]
            angle = position / 10000 ** (np.arange(0, d, 2) / d)
            table = np.zeros((config.max_length, d), "float32")
            table[:, 0::2], table[:, 1::2] = np.sin(angle), np.cos(angle)
            self.register_buffer("position", torch.from_numpy(table))
            self.transformer = torch.nn.Transformer(
                d, config.num_heads, config.num_layers, config.num_layers, config.d_ff,
                config.dropout_rate, batch_first=True,
                layer_norm_eps=config.layer_norm_epsilon)

        def embed(self, ids):
            x = self.embedding(ids) * math.sqrt(d)
            return self.dropout(x + self.position[: ids.shape[1]])

        def forward(self, source, target):
            length = target.shape[1]
            causal = torch.triu(torch.ones(length, length, dtype=torch.bool,
                                           device=target.device), diagonal=1)
            source_pad, target_pad = source == config.pad_id, target == config.pad_id
            source_pad = source_pad & ~source_pad.all(dim=1, keepdim=True)
            target_pad = target_pad & ~target_pad.all(dim=1, keepdim=True)
            y = self.transformer(
                self.embed(source), self.embed(target), tgt_mask=causal,
                src_key_padding_mask=source_pad, tgt_key_padding_mask=target_pad,
                memory_key_padding_mask=source_pad, tgt_is_causal=True)
            return y @ self.embedding.weight.T + self.output_bias

    return TorchTransformer()


def torch_model_and_step(config, batch):
    """`torch_transformer(config)` with Adam(0.9, 0.98, 1e-9), eq. (3) and a
    label-smoothed loss: `(model, step)`, `step()` training on `batch` (NumPy
    source, target, labels) once on the CPU and returning the loss."""
    import torch
    import torch.nn.functional as F

    d, V = config.d_model, config.vocab_size
    model = torch_transformer(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    warmup = config.warmup_steps
    schedule = torch.optim.lr_scheduler.LambdaLR(  # eq. (3), steps counted from 1
        optimizer, lambda i: d**-0.5 * min((i + 1) ** -0.5, (i + 1) * warmup**-1.5))
    source, target, labels = (torch.from_numpy(array).long() for array in batch)
    model.train()

    def step():
        optimizer.zero_grad(set_to_none=True)
        logits = model(source, target)
        loss = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1),
                               ignore_index=config.pad_id,
                               label_smoothing=config.label_smoothing)
        loss.backward()
        optimizer.step()
        schedule.step()
        return loss.item()

    return model, step
