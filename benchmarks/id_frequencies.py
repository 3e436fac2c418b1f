"""The unigram frequencies of a real tokenized corpus (§5.1), for gpu.py.

Learns the SentencePiece vocabulary the Multi30k recipe would learn (one
shared vocabulary of `--vocab-size` pieces over both languages of the training
split), tokenizes the training split with it and writes the count of every id
as a NumPy array: `gpu.py --id-frequencies FILE` then draws its batches' ids
from that distribution rather than from a synthetic Zipf law, so that the
embedding gradient's scatter sees the repeats of real text. Needs TensorFlow
and tf-text (the tokenizer), so run it where the recipes run and carry the
file to the GPU machine.

    python benchmarks/id_frequencies.py --data-dir ../shared/data/multi30k --output ids.npy
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import checkout  # noqa: F401  this tree's library and program, installed or not

    from keras_transformer_app.logs import start

    start()

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: F401  puts the repository on sys.path


def build_parser():
    """The script's command-line options."""
    parser = common.argument_parser(__doc__)
    parser.add_argument("--data-dir", required=True,
                        help="Multi30k folder (train.de, train.en, ...; .gz ok)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--output", required=True, help="the .npy file to write")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)

    from keras_transformer.data.corpora import load_multi30k
    from keras_transformer.tokenizers import SubwordTokenizer

    train = load_multi30k(args.data_dir)["train"]
    texts = train.sources + train.targets
    common.progress(f"id_frequencies: learning {args.vocab_size} pieces from "
                    f"{len(texts):,} sentences")
    tokenizer = SubwordTokenizer.train(texts, args.vocab_size)
    counts = np.zeros(tokenizer.vocab_size, "int64")
    for start in range(0, len(texts), 4096):
        for ids in tokenizer.tokenize(texts[start:start + 4096]):
            np.add.at(counts, np.asarray(ids, "int64"), 1)
    np.save(args.output, counts)
    top = np.argsort(counts)[::-1][:5]
    common.emit({"benchmark": "id_frequencies", "vocab_size": int(tokenizer.vocab_size),
                 "tokens": int(counts.sum()), "sentences": len(texts),
                 "most_frequent_share": float(counts[top[0]] / counts.sum()),
                 "top_ids": top.tolist(), "output": args.output})


if __name__ == "__main__":
    common.run_script(main)
