"""`keras-transformer translate` (§6.1 decoding): sentences, files and pipes, line by line.

One output line per input line, in order (or `--n-best` lines), so the command works in
pipes, with `paste` and with sacreBLEU. Standard input is read as bytes and each line
decoded on its own: a line that is not UTF-8 gets an error naming it and its byte, and
an empty output line, while the other lines are translated; an argument sentence
(`sys.argv` keeps undecodable bytes as surrogate escapes) is checked the same way.

Lines are translated in batches of those that have arrived: a batch starts with the
next line and takes the lines that arrive within `WAIT_MS` of it, at most
`--batch-size`. A file, or a pipe that a fast writer fills, gives full batches and the
batched speed; a pipe whose lines come one at a time, or a terminal, is answered line
by line as they come, instead of waiting for a batch to fill.
"""

import dataclasses
import itertools
import os
import queue
import re
import stat
import sys
import threading
import time
import warnings
from typing import Optional

from keras_transformer_app.cli import commands

# Lines translated together, at most.
BATCH_SIZE = 32
# How long a batch waits for more lines after its first one.
WAIT_MS = 50
_END = object()  # the reader's mark for the end of the input


@dataclasses.dataclass(frozen=True)
class Line:
    """One input line: its number (counted from 0) and its text, or the reason it
    cannot be read (`error`, with `text` empty)."""

    number: int
    text: str
    error: Optional[str] = None


def run(args):
    """`keras-transformer translate`: the SENTENCES given, or standard input line by
    line. Exits with status 2 after the last line if a line was not UTF-8."""
    sampling = commands.sampling_options(args)
    if sampling is None and args.n_best is not None and args.n_best > args.beam_size:
        raise ValueError(f"--n-best {args.n_best} is more than --beam-size {args.beam_size}: "
                         "beam search keeps beam-size hypotheses, so raise --beam-size.")
    translator = commands.load_translator(args.model, args.max_source_length,
                                          args.compute_type, args.intra_threads)
    if translator.engine == "ctranslate2":
        _check_ctranslate2(args, sampling)
    if args.sentences:
        unit = "sentence"
        lines = [decode(number, _argument_bytes(sentence))
                 for number, sentence in enumerate(args.sentences)]
        batches = (lines[start:start + args.batch_size]
                   for start in range(0, len(lines), args.batch_size))
    else:
        # Read at call time, so that a caller (or a test) may replace sys.stdin.
        stdin, unit = sys.stdin, "line"
        if _is_terminal(stdin):
            print("Translating each line typed; end with Ctrl-D.", file=sys.stderr)
        batches = read_batches(stdin, args.batch_size, WAIT_MS / 1000)
    search = dict(beam_size=args.beam_size, alpha=args.alpha, sampling=sampling,
                  return_alignment=args.print_alignment)
    unreadable = 0
    for batch in batches:
        unreadable += write_translations(translator, batch, sys.stdout, args.n_best, search,
                                         unit)
    if unreadable:
        sys.exit(2)


def _check_ctranslate2(args, sampling):
    """What CTranslate2 cannot do is an error, what it does otherwise a warning line."""
    from keras_transformer.inference import ctranslate2
    from keras_transformer.inference.translator import NO_ALIGNMENT

    if args.print_alignment:
        raise ValueError(NO_ALIGNMENT)
    if sampling is not None:
        print(f"warning: {ctranslate2.UNSEEDED_SAMPLES}", file=sys.stderr)
        # The command owns its process: the line above says it once.
        warnings.simplefilter("ignore", ctranslate2.UnseededSamplesWarning)


def decode(number, data):
    """The `Line` of `data` (bytes, or a str already decoded) numbered `number`,
    without its line ending ("\n" or "\r\n"); nothing else is stripped."""
    if data.endswith(b"\r\n" if isinstance(data, bytes) else "\r\n"):
        data = data[:-2]
    elif data.endswith(b"\n" if isinstance(data, bytes) else "\n"):
        data = data[:-1]
    if not isinstance(data, bytes):
        return Line(number, data)
    try:
        return Line(number, data.decode("utf-8"))
    except UnicodeDecodeError as error:
        return Line(number, "", f"byte 0x{data[error.start]:02x} at offset {error.start} is "
                                "not valid UTF-8")


def _argument_bytes(sentence):
    """The bytes of a command-line argument as the shell passed them: Python keeps
    bytes it cannot decode as surrogate escapes."""
    try:
        sentence.encode("utf-8")
        return sentence
    except UnicodeEncodeError:
        return sentence.encode("utf-8", "surrogateescape")


def read_batches(stream, batch_size, wait):
    """Batches of the `Line`s of `stream`: a regular file (or an in-memory stream)
    in full batches of `batch_size`; a pipe or a terminal through a reader thread,
    each batch holding the lines that arrived within `wait` seconds of its first,
    at most `batch_size`."""
    binary = getattr(stream, "buffer", stream)
    lines = (decode(number, data) for number, data in enumerate(_raw_lines(binary)))
    if not _arrives_over_time(binary):
        while batch := list(itertools.islice(lines, batch_size)):
            yield batch
        return
    arrived = queue.Queue(maxsize=4 * batch_size)
    threading.Thread(target=_read_into, args=(lines, arrived), daemon=True,
                     name="translate-stdin").start()
    while (first := arrived.get()) is not _END:
        batch, deadline = [_raise_error(first)], time.monotonic() + wait
        while len(batch) < batch_size:
            remaining = deadline - time.monotonic()
            try:
                line = arrived.get(timeout=remaining) if remaining > 0 else arrived.get_nowait()
            except queue.Empty:
                break
            if line is _END:
                yield batch
                return
            batch.append(_raise_error(line))
        yield batch


def _raw_lines(stream):
    """The lines of `stream` as they arrive, each with its line ending.

    From a file descriptor they are read with `os.read`, which returns what has
    arrived: the reader thread of a pipe then holds no lock of Python's buffered
    stdin while it waits, so Ctrl-C, which ends the interpreter while the thread
    still waits, finds nothing locked (with `readline` the interpreter aborted,
    unable to flush stdin at shutdown). An in-memory stream is read with
    `readline`.
    """
    try:
        descriptor = stream.fileno()
    except (AttributeError, OSError, ValueError):  # in memory
        while line := stream.readline():
            yield line
        return
    pending = b""
    while chunk := os.read(descriptor, 1 << 16):
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            yield line + b"\n"
    if pending:
        yield pending


def _arrives_over_time(stream):
    """Whether the lines of `stream` may arrive one by one: a pipe, a terminal or a
    socket, not a regular file or an in-memory stream."""
    try:
        return not stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):  # no file descriptor: in memory
        return False


def _read_into(lines, arrived):
    """The reader thread: puts each line in the queue as it arrives, then `_END`
    (a read error goes in the queue, to be raised by the main thread)."""
    try:
        for line in lines:
            arrived.put(line)
    except Exception as error:  # noqa: BLE001  raised by the main thread
        arrived.put(error)
    arrived.put(_END)


def _raise_error(item):
    if isinstance(item, Exception):
        raise item
    return item


def write_translations(translator, batch, out, n_best, search, unit):
    """Translates the `Line`s of `batch` and writes one output line per line
    (`n_best` lines in the n-best format), then flushes `out`. Empty and unreadable
    lines are not decoded: their output is empty (score 0). With
    `search["return_alignment"]`, each translation is followed by a tab and its
    alignment. Returns the number of unreadable lines, each reported on stderr."""
    from keras_transformer.inference.translator import (
        Hypothesis,
        SourceTruncatedWarning,
        Translation,
    )

    num_return = n_best or 1
    rows = [row for row, line in enumerate(batch) if line.text]
    with warnings.catch_warnings():
        # Said below, with the input's own line numbers.
        warnings.simplefilter("ignore", SourceTruncatedWarning)
        # Input line numbers name the random streams of sampling, so a line's
        # samples do not depend on how the lines were batched.
        results = translator.translate(
            [batch[row].text for row in rows], batch_size=len(batch), num_return=num_return,
            stream_ids=[batch[row].number for row in rows], **search) if rows else []
    translations = [Translation([Hypothesis("", 0.0, [], [])] * num_return)] * len(batch)
    for row, result in zip(rows, results):
        translations[row] = result
        if result.truncated:
            print(f"warning: {unit} {batch[row].number + 1} is longer than max_source_length="
                  f"{translator.max_source_length} (tokens + EOS); it was translated "
                  "truncated to it", file=sys.stderr)
    unreadable = [line for line in batch if line.error]
    for line in unreadable:
        print(f"error: {unit} {line.number + 1}: {line.error}; its output line is left "
              "empty", file=sys.stderr)
    for line, result in zip(batch, translations):
        for hypothesis in result.hypotheses:
            fields = [] if n_best is None else [str(line.number), f"{hypothesis.score:.4f}"]
            fields.append(_one_line(hypothesis.text))
            if search.get("return_alignment", False):
                fields.append(" ".join(f"{source}-{target}" for target, source
                                       in enumerate(hypothesis.alignment)))
            out.write("\t".join(fields) + "\n")
    out.flush()
    return len(unreadable)


def _one_line(text):
    """`text` with any line break replaced by a space: one output line per input."""
    return re.sub(r"[\r\n]+", " ", text)


def _is_terminal(stream):
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
