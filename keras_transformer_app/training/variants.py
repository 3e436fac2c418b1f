"""§6.2 Model Variations: Table 3's variants, each trained for the same time and measured.

The paper trains every variant of its base model for the same number of steps and
reports perplexity and BLEU on the development set. `train_and_measure` gives a
variant (a `TransformerConfig`, such as those of `config.table3_variants`) a training
*time* instead, so that variants of different cost compete on equal hardware time, then
measures it on the validation split: perplexity per subword token (cross-entropy without
label smoothing, whatever ε_ls it trained with) and BLEU of beam search. `markdown`
lays the rows out as Table 3 does. `recipes/table3.py` runs them all.
"""

import os
import time

import keras

from keras_transformer import evaluation, saving
from keras_transformer.data.pipeline import make_dataset
from keras_transformer.inference import Translator
from keras_transformer.model import Transformer
from keras_transformer.training.compile import compile_model
from keras_transformer_app.training import scoring
from keras_transformer_app.training.fit import TimeBudget, fit_steps, optimizer_step

# (key of a row, column title) of Table 3's layout.
COLUMNS = [("variant", "variant"), ("group", "Table 3"), ("N", "N"), ("d_model", "d_model"),
           ("d_ff", "d_ff"), ("h", "h"), ("d_k", "d_k"), ("d_v", "d_v"), ("dropout", "P_drop"),
           ("label_smoothing", "ε_ls"), ("positions", "positions"), ("parameters", "params"),
           ("steps", "steps"), ("train_seconds", "train s"), ("dev_perplexity", "dev PPL"),
           ("dev_bleu", "dev BLEU"), ("dev_bleu_lowercase", "dev BLEU (lc)")]


def train_and_measure(config, tokenizer, splits, run_dir, *, variant, group, minutes,
                      max_steps=100_000,
                      checkpoint_every=100, lr_scale=1.0, max_sentence_length=64,
                      tokens_per_batch=2048, beam_size=4, alpha=0.6, eval_limit=None, seed=0,
                      verbose=2):
    """Trains `config` for `minutes` (at most `max_steps`) in `run_dir` and measures it
    on `splits["validation"]`; a variant measured before is read back from
    `RUN_DIR/results.json` instead.

    Args:
        config: The variant's `TransformerConfig`.
        tokenizer: The shared `SubwordTokenizer` that the config's vocabulary follows.
        splits: Maps "train" and "validation" to `ParallelCorpus` objects.
        run_dir: The variant's folder (checkpoints, logs, results.json).
        variant, group: The variant's name and its Table 3 row ("A" ... "E", or "").
        minutes: Training time.
        max_steps, checkpoint_every: Step cap, and steps between checkpoints.
        lr_scale: Constant factor on the eq. (3) learning rate.
        max_sentence_length, tokens_per_batch: The batching (§5.1).
        beam_size, alpha: Beam search of the BLEU score (§6.1).
        eval_limit: Score BLEU on only the first N validation sentences.
        seed: Random seed, the same for every variant.
        verbose: `model.fit` verbosity.

    Returns:
        The variant's row, also written to RUN_DIR/results.json: variant, group, its
        architecture (N, d_model, d_ff, h, d_k, d_v, dropout,
        label_smoothing, positions, parameters), steps, train_seconds, dev_perplexity,
        dev_bleu, dev_bleu_lowercase, dev_sentences and backend.
    """
    results_path = os.path.join(run_dir, "results.json")
    if os.path.exists(results_path):
        print(f"   finished earlier: {results_path}")
        return saving.read_json(results_path)
    keras.utils.set_random_seed(seed)
    dataset_args = dict(source_tokenizer=tokenizer, target_tokenizer=tokenizer, verbose=False,
                        max_sentence_length=max_sentence_length,
                        tokens_per_batch=tokens_per_batch)
    train, validation = splits["train"], splits["validation"]
    train_dataset, _ = make_dataset(train.sources, train.targets, repeat=True, seed=seed,
                                    **dataset_args)
    dev_dataset, _ = make_dataset(validation.sources, validation.targets, shuffle=False,
                                  **dataset_args)
    model = Transformer(config)
    compile_model(model, config, lr_scale)
    start = time.time()
    fit_steps(model, train_dataset, run_dir, max_steps,
              checkpoint_every=min(checkpoint_every, max_steps), keep_checkpoints=1,
              verbose=verbose, extra_callbacks=[TimeBudget(minutes * 60)])
    train_seconds, steps = time.time() - start, optimizer_step(model)
    dev_perplexity = scoring.perplexity(model, dev_dataset, config.pad_id)
    limit = eval_limit or len(validation.sources)
    result = evaluation.evaluate(Translator(model, tokenizer), validation.sources[:limit],
                                 validation.targets[:limit], beam_size=beam_size, alpha=alpha)
    row = {"variant": variant, "group": group, "N": config.num_layers,
           "d_model": config.d_model, "d_ff": config.d_ff, "h": config.num_heads,
           "d_k": config.resolved_key_dim, "d_v": config.resolved_value_dim,
           "dropout": config.dropout_rate, "label_smoothing": config.label_smoothing,
           "positions": config.position_encoding, "parameters": model.count_params(),
           "steps": steps, "train_seconds": round(train_seconds, 1),
           "dev_perplexity": round(dev_perplexity, 3), "dev_bleu": round(result.bleu, 2),
           "dev_bleu_lowercase": round(result.bleu_lowercase, 2), "dev_sentences": limit,
           "backend": keras.backend.backend()}
    saving.write_json(results_path, row)
    print(f"   {steps} steps in {train_seconds:.0f} s: dev PPL {row['dev_perplexity']}, "
          f"BLEU {row['dev_bleu']}")
    return row


def markdown(rows):
    """Rows of `train_and_measure` as a Markdown table."""
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |",
             "|" + " --- |" * len(COLUMNS)]
    for row in rows:
        cells = [f"{row[key]:,}" if key == "parameters" else str(row[key]) for key, _ in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
