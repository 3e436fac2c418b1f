"""What checking every batch's ids costs `model.fit` (§5, issue 19).

`Transformer.fit` maps a check over a `tf.data.Dataset` (smallest and largest
id of the source, target and labels of each batch against the model's
vocabulary) before the compiled step reads it. This script trains the
quickstart's model on the quickstart's pipeline (the synthetic task,
`make_dataset`, 2048 tokens per batch) for `--steps` steps, once through
`Transformer.fit` (checked) and once through `keras.Model.fit` on the same
model class (unchecked), in alternating rounds, and reports target tokens/s
(non-padding labels per second of `fit`, the first window of each model
excluded: it compiles).

    KERAS_BACKEND=jax python benchmarks/experiments/id_check.py [--steps 150] [--rounds 3]
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import common  # noqa: E402,F401  (puts the repository on sys.path)


def build_parser():
    """The script's command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150, help="timed steps per round and model")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)

    import keras
    import numpy as np

    import keras_transformer as kt
    from keras_transformer.data.corpora import synthetic_translation
    from keras_transformer.data.pipeline import make_dataset
    from keras_transformer.tokenizers import SubwordTokenizer

    corpus = synthetic_translation(20000, seed=1)
    tokenizer = SubwordTokenizer.train(corpus.sources + corpus.targets, 320)
    dataset, stats = make_dataset(corpus.sources, corpus.targets, tokenizer,
                                  max_sentence_length=32, tokens_per_batch=2048, repeat=True,
                                  verbose=False)
    tokens_per_step = stats.target_tokens / stats.batches_per_pass
    config = kt.TransformerConfig.tiny(vocab_size=tokenizer.vocab_size, d_model=128,
                                       num_heads=4, d_ff=256, num_layers=2, dropout_rate=0.0)
    models = {}
    for name in ("checked", "unchecked"):
        keras.utils.set_random_seed(0)
        model = kt.Transformer(config)
        model.compile(optimizer=kt.paper_adam(128, 200),
                      loss=kt.LabelSmoothedCrossEntropy(0.1, pad_id=config.pad_id))
        models[name] = model

    def fit(name, steps):
        model = models[name]
        fit_function = model.fit if name == "checked" else (
            lambda *a, **k: keras.Model.fit(model, *a, **k))
        start = time.perf_counter()
        fit_function(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
        return time.perf_counter() - start

    for name in models:  # compiles every bucket shape it meets
        common.progress(f"{name}: warm-up window of {args.steps} steps")
        fit(name, args.steps)
    rates = {name: [] for name in models}
    for round_index in range(args.rounds):
        for name in (("checked", "unchecked") if round_index % 2 == 0
                     else ("unchecked", "checked")):
            seconds = fit(name, args.steps)
            rates[name].append(args.steps * tokens_per_step / seconds)
            common.progress(f"round {round_index + 1} {name}: {rates[name][-1]:,.0f} tokens/s")
    checked, unchecked = (statistics.median(rates[n]) for n in ("checked", "unchecked"))
    ratios = [c / u for c, u in zip(rates["checked"], rates["unchecked"])]
    print(f"backend {keras.backend.backend()}, {args.steps} steps x {args.rounds} rounds, "
          f"{tokens_per_step:.0f} target tokens per step")
    print(f"checked   (Transformer.fit): {checked:,.0f} target tokens/s (median)")
    print(f"unchecked (keras.Model.fit): {unchecked:,.0f} target tokens/s (median)")
    print(f"checked / unchecked: {checked / unchecked:.3f} (rounds "
          f"{', '.join(f'{r:.3f}' for r in ratios)}; spread of unchecked rounds "
          f"{(max(rates['unchecked']) - min(rates['unchecked'])) / unchecked:.1%})")
    assert np.isfinite(checked) and np.isfinite(unchecked)


if __name__ == "__main__":
    common.run_script(main)
