"""§5.1 Training Data: a run's subword vocabulary, learned once and then reused.

"Sentences were encoded using byte-pair encoding, which has a shared source-target
vocabulary" (§5.1). A run learns its vocabulary (shared, or one per language) on the
training split the first time, saves it in the run directory, and reads it back when it
resumes: the checkpoints' embeddings are sized to it, so it must never change under them.
In a run of several processes the chief learns it and the others read it
(`shared_tokenizers`).
"""

import contextlib
import os
import sys
import threading
import time

from keras_transformer import saving, tokenizers
from keras_transformer.data.corpora import ParallelCorpus
from keras_transformer.data.corpus_files import corpus_size, sample_pairs
from keras_transformer_app.training.sentencepiece_trainer import sentence_piece_proto


def learn_or_load_tokenizers(run_dir, corpus, vocab_size, kind="sentencepiece",
                             separate=False, sample=None, seed=0):
    """The run's `(source, target)` tokenizers (the same one twice when shared): read
    from `run_dir` when saved there, so a resumed run keeps its vocabulary, else learned
    on the training `corpus` (a `ParallelCorpus` or a streamed one,
    `keras_transformer.data.corpus_files`), or on `sample` of its pairs drawn
    uniformly with `seed`, and saved.

    Raises:
        ValueError: `run_dir` holds the other layout (shared or separate): its
            checkpoints have embeddings of other shapes.
    """
    def saved(directory):
        return os.path.exists(os.path.join(directory, "tokenizer.json"))

    directories = saving.tokenizer_directories(run_dir, separate)
    other = saving.tokenizer_directories(run_dir, not separate)
    if any(map(saved, other)):
        kind_trained = "a shared vocabulary" if separate else "separate vocabularies"
        raise ValueError(
            f"The run directory {run_dir} was trained with {kind_trained} ("
            f"{', '.join(os.path.basename(d) + '/' for d in other)}): resume it with "
            f"separate_vocabularies={not separate}, or give a new run directory.")
    if all(map(saved, directories)):
        print(f"Tokenizer: reusing {', '.join(directories)}")
        return saving.load_tokenizers(run_dir)
    start = time.time()
    if sample is not None or not isinstance(corpus, ParallelCorpus):
        total = corpus_size(corpus)
        with _elapsed(f"Tokenizer: drawing {min(sample or total, total):,} of {total:,} "
                      "pairs"):
            corpus = sample_pairs(corpus, sample, seed)
    texts = [corpus.sources, corpus.targets] if separate else [corpus.sources + corpus.targets]
    per_language = " per language" if separate else ""
    with _elapsed(f"Tokenizer: learning a {kind} vocabulary of {vocab_size}{per_language} "
                  f"from {' and '.join(f'{len(t):,}' for t in texts)} sentences"):
        # SentencePiece's trainer runs in a child process, which gives back its memory.
        learned = [tokenizers.SubwordTokenizer.train(
            t, vocab_size, kind=kind, sentence_piece_trainer=sentence_piece_proto) for t in texts]
    saving.save_tokenizers(run_dir, learned[0], learned[-1])
    print(f"Tokenizer: learned {kind} {'vocabularies' if separate else 'vocabulary'} of "
          f"{' and '.join(str(t.vocab_size) for t in learned)} tokens in "
          f"{time.time() - start:.0f} s")
    return learned[0], learned[-1]


def shared_tokenizers(distributed, run_dir, corpus, vocab_size, kind="sentencepiece",
                      separate=False, sample=None, seed=0):
    """`learn_or_load_tokenizers` in a run of one or several processes: the chief
    (`distributed.is_chief`) learns or reads the tokenizers and saves them; the other
    processes wait for it (`distributed.barrier`), then read them from `run_dir`, which
    every process must see at the same path.

    Raises:
        FileNotFoundError: A process other than the chief finds no tokenizer in
            `run_dir` once the chief has saved it: the folder is not shared.
    """
    if distributed.is_chief:
        pair = learn_or_load_tokenizers(run_dir, corpus, vocab_size, kind, separate, sample,
                                        seed)
    distributed.barrier("tokenizers")
    if distributed.is_chief:
        return pair
    directories = saving.tokenizer_directories(run_dir, separate)
    if not all(os.path.exists(os.path.join(d, "tokenizer.json")) for d in directories):
        raise FileNotFoundError(
            f"Process {distributed.cluster.process_id} finds no tokenizer in {run_dir} after "
            "the chief saved it there: the run directory must be a folder that every process "
            "shares at the same path (one machine, NFS, a ReadWriteMany volume).")
    print(f"Tokenizer: reading the chief's {', '.join(directories)}")
    return saving.load_tokenizers(run_dir)


@contextlib.contextmanager
def _elapsed(label, interval=1.0):
    """Shows `label` with the seconds elapsed, updated every `interval` on a terminal,
    while the block runs (a phase whose length cannot be known in advance)."""
    interactive = sys.stdout.isatty()
    start, done = time.time(), threading.Event()

    def tick():
        while not done.wait(interval):
            print(f"\r{label}... {time.time() - start:.0f} s", end="", flush=True)

    print(f"{label}...", end="" if interactive else "\n", flush=True)
    ticker = threading.Thread(target=tick, daemon=True) if interactive else None
    if ticker is not None:
        ticker.start()
    try:
        yield
    finally:
        done.set()
        if ticker is not None:
            ticker.join()
            print(f"\r{label}... {time.time() - start:.0f} s")
