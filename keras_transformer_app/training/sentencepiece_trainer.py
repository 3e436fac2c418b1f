"""§5.1 Training Data: SentencePiece's BPE trainer, in a process of its own.

`sentence_piece_proto`, which a run's vocabulary (`vocabulary.py`) passes to
`keras_transformer.tokenizers.SubwordTokenizer.train` as its trainer, learns the model
the library learns in its caller's process (the same options, the same bytes) in a
child process, so that what the trainer allocates goes back to the system when it
ends instead of staying in the training run's heap.
"""

import json
import os
import signal
import subprocess
import sys

from keras_transformer.tokenizers import vocabulary_size_error
from keras_transformer_app import logs

# SentencePiece's trainer, run by `sentence_piece_proto` in a process of its own: the
# sentences come on standard input (one JSON string a line), the model or
# SentencePiece's error goes to standard output. Ctrl-C ends it quietly (the parent
# reports), and on Linux it ends with its parent, even a killed one.
_TRAINER = """
import ctypes, io, json, os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
if sys.platform.startswith("linux"):
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != int(sys.argv[2]):  # the parent ended before that
        sys.exit(1)
import sentencepiece
model = io.BytesIO()
try:
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=(json.loads(line) for line in sys.stdin.buffer),
        model_writer=model, **json.loads(sys.argv[1]))
except RuntimeError as error:
    sys.stdout.buffer.write(b"error\\n" + str(error).encode())
    sys.exit(1)
sys.stdout.buffer.write(b"model\\n" + model.getvalue())
"""


def sentence_piece_proto(texts, options):
    """SentencePiece's BPE model learned from the list `texts` with the trainer's
    `options` (`keras_transformer.tokenizers.sentence_piece_options`), serialized: what
    `learn_sentence_piece` gives in this process (the same bytes).

    The trainer runs in a child process (Python and SentencePiece, no TensorFlow), fed
    through a pipe: what it allocates goes back to the system when it ends. In this
    process it stayed: after learning WMT14's vocabulary from 2,000,000 sentences,
    1.15 GB more than before (0.78 GB after `malloc_trim`), which every later phase
    of the run carried. What it logs goes to file descriptor 2, set aside in a command
    line that quiets the native logs and shown (its end) only if it fails
    (`logs.hidden_native_lines`).

    Raises:
        RuntimeError: SentencePiece's error, or the trainer ended without a model.
    """
    with logs.hidden_native_lines(tail_bytes=4000):
        kind, content, status = _run_trainer(texts, options)
        error = None if status == 0 and kind == b"model" else _error(kind, content, status)
        if error is not None and vocabulary_size_error(error, 0, len(texts)) is None:
            raise error  # the end of its log is shown above the error
    if error is not None:
        raise error  # the size: SubwordTokenizer.train names the bound that works
    return content


def _run_trainer(texts, options):
    """(kind, content, status) of the trainer's run on `texts`: b"model" and the model,
    or b"error" and SentencePiece's message, and its exit status."""
    sys.stderr.flush()
    trainer = subprocess.Popen(
        [sys.executable, "-c", _TRAINER, json.dumps(options), str(os.getpid())],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        try:
            for start in range(0, len(texts), 10_000):
                trainer.stdin.write("".join(
                    json.dumps(text, ensure_ascii=False) + "\n"
                    for text in texts[start:start + 10_000]).encode())
            trainer.stdin.close()
        except BrokenPipeError:
            pass  # it ended early: its status says why
        output = trainer.stdout.read()
        status = trainer.wait()
    finally:
        if trainer.poll() is None:  # interrupted here
            trainer.kill()
            trainer.wait()
    kind, _, content = output.partition(b"\n")
    return kind, content, status


def _error(kind, content, status):
    """The RuntimeError of a trainer that gave no model."""
    if kind == b"error":
        return RuntimeError(content.decode(errors="replace"))
    if status < 0:
        name = signal.Signals(-status).name
        hint = (" (out of memory? learn from fewer sentences: a recipe's --tokenizer-sample)"
                if name == "SIGKILL" else "")
        return RuntimeError(f"SentencePiece's trainer was ended by {name}{hint}.")
    return RuntimeError(f"SentencePiece's trainer ended with status {status} and no model "
                        "(its log is on file descriptor 2).")
