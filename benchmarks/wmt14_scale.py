"""The WMT14 recipe at the paper's size on this machine: from 4.5 million pairs of text
to the first training steps, with its memory and the time of each phase.

Makes a corpus in the recipe's `--data-dir` layout (train, newstest2013, newstest2014,
`.en` and `.de`): `--pairs` training pairs (4.5 million, WMT14's count), each two
Multi30k training pairs joined, drawn with a seed, which gives about WMT14's sentence
length and 1.2 GB of text; the test sets join Multi30k's validation and test pairs the
same way (200 pairs each). Then it runs the same recipe command twice, with a small
model and batches of 2,048 tokens a side (`--tokens-per-batch`): `--steps 1`, then
`--steps 2`, which resumes, reading the vocabulary and the token cache the first wrote.
It reports for each run:

    peak RSS     the recipe process's high-water mark (VmHWM): when the data is ready
                 (before training), and at the end; and the peak of the recipe with
                 its child processes (SentencePiece's trainer), their VmRSS summed
                 twice a second
    RSS          its resident memory (VmRSS) as each phase's line comes: what each
                 phase still holds, where the peak says what it once took; and of it
                 the pages of mapped files (RssFile: the libraries, the token cache),
                 which the kernel can drop and read again
    phases       seconds from the command to each line the recipe prints: the corpus
                 read and counted ("Pairs:"), the vocabulary's sample drawn and
                 learned, the ids tokenized and cached (or read from the cache), the
                 batching plan, and the first training steps done ("Trained")
    padding      the share of padding in the batches, from the recipe's "Data:" line,
                 against the Multi30k recipe's on its own data
    disk         the corpus's size, and the token cache's, each of its files' (the ids
                 and their offsets, per side)

Goals (issue 52): peak memory <= 4 GB, the first step within 15 minutes of the
command, a second run's within 2 minutes, padding no worse than Multi30k's. The
corpus takes about 1.2 GB of disk in `--work-dir` (kept for reruns with
`--keep-corpus`).

    python benchmarks/wmt14_scale.py --work-dir /tmp/wmt14_scale
    python benchmarks/wmt14_scale.py --quick   # 50,000 pairs: a smoke run, figures meaningless
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import checkout  # noqa: F401  this tree's library and program, installed or not

    from keras_transformer_app.logs import start

    start()

import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
import records
from serving import git_commit

DATA_DIR = common.multi30k_dir()
MODEL = ["--preset", "tiny", "--d-model", "64", "--d-ff", "128", "--num-heads", "2",
         "--num-layers", "1", "--max-length", "256", "--warmup-steps", "100"]
# (label, the line that ends the phase), in the order the recipe prints them.
PHASES = (("read", r"^Pairs: "), ("sampled", r"^Tokenizer: learning "),
          ("vocabulary", r"^Tokenizer: (learned|reusing) "),
          ("tokenized", r"^Data: (cached the ids|reading the .* tokenized pairs)"),
          ("planned", r"^Data: \d+/\d+ pairs kept"),
          ("first steps", r"^Trained (to step )?\d+"))
# Batches of 2,048 tokens a side by default, not the paper's 25,000: a step's memory
# grows with its batch times the vocabulary (the logits), whatever the corpus; on a
# CPU the step at 2,048 tokens and the data fit the 4 GB goal together, at 4,096
# the step alone takes 1.2 GB more (docs/wmt14.md).
TOKENS_PER_BATCH = 2048
# Test sets kept small: the validation loss is computed at every checkpoint. --quick's
# are smaller still: each batch shape of the validation set is a compilation of the
# evaluation step (TensorFlow's XLA), and 200 pairs made the quick run's first step 48 s.
TEST_PAIRS = 200
QUICK_TEST_PAIRS = 16
PADDING = re.compile(r"padding (\d+)% of source and (\d+)% of target positions")


def build_parser():
    """The script's command-line options."""
    parser = common.argument_parser(__doc__)
    parser.add_argument("--pairs", type=int, help="training pairs made (default: 4,500,000, "
                        "WMT14's count; 50,000 with --quick)")
    parser.add_argument("--work-dir", default="/tmp/wmt14_scale",
                        help="where the corpus and the run directory go")
    parser.add_argument("--data-dir", default=DATA_DIR,
                        help="Multi30k's files (train, val, test_2016_flickr .en/.de[.gz])")
    parser.add_argument("--backend", default="tensorflow", help="the recipe's KERAS_BACKEND")
    parser.add_argument("--tokens-per-batch", type=int, default=TOKENS_PER_BATCH,
                        help="the recipe's batch size in tokens a side (default: %(default)s); "
                             "the training step's memory grows with it")
    parser.add_argument("--loss-chunk-size", type=int, default=1024,
                        help="the recipe's --loss-chunk-size (default: %(default)s, the "
                             "recipe's; 0 takes the whole logits at once)")
    parser.add_argument("--keep-corpus", action="store_true",
                        help="reuse a corpus already made in --work-dir")
    parser.add_argument("--quick", action="store_true",
                        help=f"50,000 pairs (unless --pairs says), test sets of "
                        f"{QUICK_TEST_PAIRS}, a 8,000-token "
                        "vocabulary (figures meaningless)")
    parser.add_argument("--output", help="also write the figures to this JSON file")
    return parser


def read_multi30k(data_dir, stem):
    from keras_transformer.data.corpora import find_file, read_parallel

    return read_parallel(find_file(data_dir, f"{stem}.en"), find_file(data_dir, f"{stem}.de"))


def write_joined(corpus, count, folder, stem, seed):
    """`count` pairs, each two pairs of `corpus` joined, drawn round by round from
    seeded permutations; written as folder/STEM.en and folder/STEM.de."""
    rng = np.random.default_rng(seed)
    size = len(corpus.sources)
    with open(os.path.join(folder, f"{stem}.en"), "w", encoding="utf-8") as english, \
            open(os.path.join(folder, f"{stem}.de"), "w", encoding="utf-8") as german:
        made = 0
        while made < count:
            order = rng.permutation(size)
            firsts, seconds = order[0:size - 1:2], order[1:size:2]
            take = min(len(firsts), count - made)
            english.write("".join(f"{corpus.sources[a]} {corpus.sources[b]}\n"
                                  for a, b in zip(firsts[:take], seconds[:take])))
            german.write("".join(f"{corpus.targets[a]} {corpus.targets[b]}\n"
                                 for a, b in zip(firsts[:take], seconds[:take])))
            made += take


def folder_bytes(folder):
    """{file name: its size in bytes} of the files in `folder`."""
    return {name: os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)}


def make_corpus(args, folder):
    """The recipe's folder layout from Multi30k; returns its size in bytes."""
    start = time.perf_counter()
    os.makedirs(folder, exist_ok=True)
    write_joined(read_multi30k(args.data_dir, "train"), args.pairs, folder, "train", seed=0)
    for stem, source in (("newstest2013", "val"), ("newstest2014", "test_2016_flickr")):
        write_joined(read_multi30k(args.data_dir, source),
                     QUICK_TEST_PAIRS if args.quick else TEST_PAIRS, folder, stem, seed=1)
    size = sum(folder_bytes(folder).values())
    common.progress(f"corpus: {args.pairs:,} training pairs, {size / 1e9:.2f} GB, made in "
                    f"{time.perf_counter() - start:.0f} s")
    return size


class Watched:
    """A command whose output lines are timed as they arrive and whose peak RSS is
    read from /proc twice a second."""

    def __init__(self, command, env):
        self.lines, self.peak_kb, self.data_peak_kb, self.tree_peak_kb = [], 0, None, 0
        self.rss_kb, self.file_kb = {}, {}
        self.start = time.perf_counter()
        self.process = subprocess.Popen(command, cwd=common.REPOSITORY, env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        threading.Thread(target=self._watch_memory, daemon=True).start()
        for line in self.process.stdout:
            self.lines.append((time.perf_counter() - self.start, line.rstrip("\n")))
            for label, pattern in PHASES:
                if label not in self.rss_kb and re.search(pattern, line):
                    self.rss_kb[label], self.file_kb[label] = self._read_memory()
            if re.search(PHASES[-2][1], line):  # the data ready, training not begun
                self.data_peak_kb = self.peak_kb
            common.progress(f"  {self.lines[-1][0]:7.1f} s  {line.rstrip()[:150]}")
        self.returncode = self.process.wait()

    def _watch_memory(self):
        while self.process.poll() is None:
            resident, _ = self._read_memory()
            children = sum(_memory_kb(pid).get("VmRSS", 0)
                           for pid in _descendants(self.process.pid))
            self.tree_peak_kb = max(self.tree_peak_kb, (resident or 0) + children)
            time.sleep(0.5)

    def _read_memory(self):
        """Updates the peak; returns the resident memory now and its mapped files'
        share, in kB (None once the process is gone)."""
        status = _memory_kb(self.process.pid)
        self.peak_kb = max(self.peak_kb, status.get("VmHWM", 0))
        return status.get("VmRSS"), status.get("RssFile")

    def phases(self):
        """{phase: seconds from the command} for the phases whose line came."""
        found = {}
        for label, pattern in PHASES:
            for seconds, line in self.lines:
                if re.search(pattern, line):
                    found[label] = seconds
                    break
        return found

    def padding(self):
        for _, line in self.lines:
            match = PADDING.search(line)
            if match and "pairs kept" in line:
                return int(match.group(1)), int(match.group(2))
        return None


def _descendants(pid):
    """The process ids of `pid`'s children, theirs, and so on (Linux's /proc)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as file:
            children = [int(child) for child in file.read().split()]
    except OSError:
        return []
    return children + [grandchild for child in children for grandchild in _descendants(child)]


def _memory_kb(pid):
    """{"VmHWM", "VmRSS", "RssFile": kB} of process `pid` (empty once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return {key: int(value.split()[0]) for key, _, value in
                    (line.partition(":") for line in status)
                    if key in ("VmHWM", "VmRSS", "RssFile")}
    except OSError:
        return {}


def recipe_command(args, folder, run_dir, steps):
    vocabulary = ["--vocab-size", "8000"] if args.quick else []
    return [sys.executable, "-m", "recipes.wmt14", "--data-dir", folder, "--run-dir", run_dir,
            "--steps", str(steps), "--checkpoint-every", "1", "--eval-limit", "10",
            "--tokens-per-batch", str(args.tokens_per_batch), "--no-export", "--verbose", "2",
            "--loss-chunk-size", str(args.loss_chunk_size), *vocabulary, *MODEL]


def multi30k_padding(args):
    """The Multi30k recipe's padding share on its own training split (its batching
    plan, no training)."""
    from keras_transformer.data.pipeline import make_dataset
    from keras_transformer.tokenizers import SubwordTokenizer

    corpus = read_multi30k(args.data_dir, "train")
    tokenizers = [SubwordTokenizer.train(texts, 8000) for texts in (corpus.targets,
                                                                    corpus.sources)]
    _, stats = make_dataset(corpus.targets, corpus.sources, *tokenizers, verbose=False,
                            max_sentence_length=64, tokens_per_batch=2048, bucket_width=4)
    return round(stats.source_padding * 100), round(stats.target_padding * 100)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.pairs is None:
        args.pairs = 50_000 if args.quick else 4_500_000
    if args.pairs < 1:
        parser.error(f"--pairs {args.pairs}: give at least 1 training pair")
    args.data_dir = common.fetched_if_cache(args.data_dir)
    folder, run_dir = (os.path.join(args.work_dir, name) for name in ("data", "run"))
    shutil.rmtree(run_dir, ignore_errors=True)
    if not (args.keep_corpus and os.path.exists(os.path.join(folder, "train.de"))):
        shutil.rmtree(folder, ignore_errors=True)
        make_corpus(args, folder)
    env = dict(os.environ, KERAS_BACKEND=args.backend, TF_CPP_MIN_LOG_LEVEL="3")
    results = {"commit": git_commit(), "machine": common.machine(), "pairs": args.pairs,
               "backend": args.backend, "tokens_per_batch": args.tokens_per_batch,
               "loss_chunk_size": args.loss_chunk_size, "runs": []}
    for steps in (1, 2):
        common.progress(f"run {steps}: the recipe, --steps {steps}")
        watched = Watched(recipe_command(args, folder, run_dir, steps), env)
        if watched.returncode:
            raise SystemExit(f"error: the recipe exited with status {watched.returncode}")
        results["runs"].append({"steps": steps, "peak_rss_gb": watched.peak_kb / 2**20,
                                "with_children_peak_rss_gb": max(watched.peak_kb,
                                                                 watched.tree_peak_kb) / 2**20,
                                "data_peak_rss_gb": (watched.data_peak_kb or 0) / 2**20,
                                "phases_s": watched.phases(), "padding": watched.padding(),
                                "rss_gb": {label: kb / 2**20 for label, kb in
                                           watched.rss_kb.items() if kb is not None},
                                "file_gb": {label: kb / 2**20 for label, kb in
                                            watched.file_kb.items() if kb is not None}})
    results["multi30k_padding"] = multi30k_padding(args)
    cache = folder_bytes(os.path.join(run_dir, "token_cache"))
    results["cache_mb"] = sum(cache.values()) / 2**20
    results["cache_files_mb"] = {name: size / 2**20 for name, size in sorted(cache.items())}
    results["corpus_gb"] = sum(folder_bytes(folder).values()) / 1e9
    command = "python " + " ".join(shlex.quote(a) for a in [
        "benchmarks/wmt14_scale.py", *(sys.argv[1:] if argv is None else argv)])
    # The table wmt14.md makes of such files (records.py), of this run alone.
    print(f"\n`{command}`\n\n{records.wmt14_scale('wmt14_scale', [results])}")
    common.write_results(results, args.output)


if __name__ == "__main__":
    common.run_script(main)
