"""The tables made from the records of finished training runs (`tables.py --record`: a
table of trials, distributed.md's table of clusters, the quickstart's table), from
`wmt14_scale.py --output` runs and from `recipes.table3`'s results; `benchmarks/tables.py`
writes and checks them, by kind."""

import json
import os

BACKEND_NAMES = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "torch"}
# The options that every trial of a recipe shares, left out of its "options" cell.
_SHARED_OPTIONS = {"--direction", "--data-dir", "--run-dir", "--verbose"}
_SHARED_FLAGS = {"--no-export"}


def _option_words(command):
    """A run's own options, word by word: its command without the program, the backend
    and the options that only say where its files are."""
    import shlex

    words = shlex.split(command)
    words = words[words.index("-m") + 2:] if "-m" in words else words[2:]
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in _SHARED_OPTIONS:
            skip = True
        elif word not in _SHARED_FLAGS:
            kept.append(word)
    return kept


def _options(command):
    """A run's own options (`_option_words`), as a table's cell."""
    kept = _option_words(command)
    return f"`{' '.join(kept)}`" if kept else "(none)"


def duration(seconds):
    """"1 h 45 min 17 s", "3 min 21 s", "42 s": the units above the seconds when not 0."""
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return (f"{hours} h {minutes} min {seconds} s" if hours else
            f"{minutes} min {seconds} s" if minutes else f"{seconds} s")


def _losses_at(losses, steps):
    """"4.242 / 3.720 / –": a record's validation loss at each of `steps`, "–" where its
    log has none."""
    return " / ".join(f"{losses[str(step)]:.3f}" if str(step) in losses else "–"
                      for step in steps)


def trials(kind, records):
    """A row per recorded run (`--record`): its options, commit, the validation loss at
    steps 1000, 2400 and 3600 and at its last step, the validation BLEU of the α it
    picked, the test BLEU of its last checkpoint and of the averaged model, and its
    training time."""
    rows = []
    for record in records:
        made, losses = record["provenance"], record["validation_loss"]
        at = _losses_at(losses, (1000, 2400, 3600))
        tuning = record.get("alpha_tuning", {})
        alpha = tuning.get("alpha")
        validation = (f"{tuning['bleu_lowercase'][str(alpha)]:.2f} ({alpha:g})" if tuning
                      else "–")
        rows.append((record["trial"], _options(made["command"]), f"commit `{made['commit']}`",
                     record["steps"], at, f"{losses[str(record['steps'])]:.3f}", validation,
                     f"{record['bleu_lowercase']:.2f} / "
                     f"{record['averaged']['bleu_lowercase']:.2f}",
                     duration(record["train_seconds"])))
    import run_all

    return run_all.table(("trial", "options", "code", "steps",
                          "validation loss at 1000 / 2400 / 3600", "at the last step",
                          "validation BLEU, lower-cased (α)",
                          "test2016, lower-cased: last / averaged", "training time"), rows)


def record(run_dir, output, trial, provenance=None, wall_seconds=None):
    """Writes the record of a finished training run that a table is made from (a row of a
    table of trials or clusters, the quickstart's and the windows' tables): its results.json,
    its training and validation loss and seconds (the window's, its compilation's and its
    validation pass's) at each window's end (training_log.csv), the run's name, the whole
    command's `wall_seconds` (`/usr/bin/time`), and, for an older results.json, `provenance`."""
    import csv

    from keras_transformer_app import run_files

    with open(run_files.path(run_dir, run_files.RESULTS), encoding="utf-8") as file:
        results = json.load(file)
    with open(run_files.path(run_dir, run_files.TRAINING_LOG), encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    # Every digit the log has: a trial's table shows 3 decimals, the table of clusters 6 (two
    # runs agree to 1e-5).
    columns = {"validation_loss": "val_loss", "training_loss": "loss", "window_seconds": "seconds",
               "compile_seconds": "compile_seconds", "validation_seconds": "validation_seconds"}
    results = {"trial": trial, **results, **{key: {row["step"].split(".")[0]: float(row[name])
                                                   for row in rows if row.get(name)}
                                             for key, name in columns.items()}}
    if wall_seconds is not None:
        results["wall_seconds"] = wall_seconds
    if provenance:
        results["provenance"] = {**provenance, **results.get("provenance", {})}
    if "provenance" not in results:
        raise ValueError(f"{run_dir}/results.json names no provenance: give the commit and "
                         "the command it ran with")
    with open(output, "w", encoding="utf-8") as file:
        json.dump(results, file, indent=1, sort_keys=True)
        file.write("\n")


def clusters(kind, records):
    """A row per recorded run of distributed.md's commands (a backend's one-process run and
    its cluster's, each `--record`ed with the run's name): the training loss at each
    window's end, the validation loss at the last, to 6 decimals, and the training time."""
    import run_all

    steps = sorted(records[0]["training_loss"], key=int)
    for record in records:
        if sorted(record["training_loss"], key=int) != steps:
            raise ValueError(f"{record['trial']}: its windows end at other steps than "
                             f"{records[0]['trial']}'s")
    rows = [(BACKEND_NAMES[record["backend"]], record["trial"],
             *(f"{record['training_loss'][step]:.6f}" for step in steps),
             f"{record['validation_loss'][steps[-1]]:.6f}", duration(record["train_seconds"]))
            for record in records]
    return run_all.table(("backend", "run", *(f"step {step}" for step in steps),
                          f"validation loss, step {steps[-1]}", "training"), rows)


def backends(kind, spec, root=None):
    """One command on each backend: a row per entry of `spec["rows"]`, each naming its
    run's record (`from`, a path from `root`) or README's row whose record it is
    (`headline`). A row gives the backend, the CPU, the commit, the steps and training
    time, the validation loss at steps 1000, 2400 and 3600 and at the last, test2016's
    BLEU (lower-cased and cased, of the last checkpoint and of the averaged model) and the
    α picked on validation with its validation BLEU. The records'
    commands must differ in nothing but the backend and where their files are, once the
    flags that `spec["defaults_since"]` names (a row's flag that the recipe has made its
    default since) are left out."""
    import run_all

    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows, commands = [], {}
    for row in spec["rows"]:
        path = _headline(row["headline"], root)["from"] if "headline" in row else row["from"]
        record = load(os.path.join(root, path))
        made, averaged = record["provenance"], record["averaged"]
        commands[path] = " ".join(word for word in _option_words(made["command"])
                                  if word not in spec.get("defaults_since", ()))
        tuning = record.get("alpha_tuning")
        validation = (f"{tuning['alpha']:g} ({tuning['bleu_lowercase'][str(tuning['alpha'])]:.2f})"
                      if tuning else f"{record['alpha']:g} (given)")
        at = _losses_at(record["validation_loss"], (1000, 2400, 3600, record["steps"]))
        rows.append((BACKEND_NAMES[record["backend"]], _machine(made, article=False),
                     f"commit `{made['commit']}`", record["steps"],
                     duration(record["train_seconds"]), at,
                     f"{record['bleu_lowercase']:.2f} / {averaged['bleu_lowercase']:.2f}",
                     f"{record['bleu']:.2f} / {averaged['bleu']:.2f}", validation))
    if len(set(commands.values())) > 1:
        raise ValueError("the runs' commands differ in more than the backend: " + "; ".join(
            f"{path}: `{options}`" for path, options in commands.items()))
    return run_all.table(("backend", "CPU", "code", "steps", "training time",
                          "validation loss at 1000 / 2400 / 3600 / the last step",
                          "test2016 lower-cased: last / averaged", "cased: last / averaged",
                          "α (validation BLEU, lower-cased)"), rows)


def wmt14_scale(kind, runs):
    """`wmt14_scale.py --output FILE` runs, a file each (docs/wmt14.md): a row per recipe
    run (the first, and the second that reads the cache), with the batch and the loss it
    ran with, its peak memory, the seconds from the command to each phase's line, and the
    padding; then each file's commit, corpus and cache, the Multi30k recipe's padding, and
    each run's resident memory as each phase's line came."""
    import run_all
    import wmt14_scale

    labels = [label for label, _ in wmt14_scale.PHASES]
    names = {"read": "corpus read", "sampled": "sample drawn", "planned": "batches planned"}
    rows, notes, memory = [], [], []
    for result in runs:
        loss = (f"chunks of {result['loss_chunk_size']:,}" if result["loss_chunk_size"]
                else "whole logits")
        for run in result["runs"]:
            phases, padding = run["phases_s"], run["padding"]
            memory.append(
                f"- {result['tokens_per_batch']:,} tokens, {loss}, "
                f"{'first' if run['steps'] == 1 else 'second'} run: "
                + ", ".join(f"{names.get(label, label)} {gb:.2f} GiB"
                            + (f" ({run['file_gb'][label]:.2f})" if label in run["file_gb"]
                               else "") for label, gb in run["rss_gb"].items()))
            rows.append((f"{result['tokens_per_batch']:,}", loss,
                         "first" if run["steps"] == 1 else "second (reads the cache)",
                         f"{run['data_peak_rss_gb']:.2f} / {run['peak_rss_gb']:.2f} GiB",
                         f"{run['with_children_peak_rss_gb']:.2f} GiB",
                         *(duration(phases[label]) if label in phases else "—"
                           for label in labels),
                         f"{padding[0]}% / {padding[1]}%" if padding else "—"))
        notes.append(f"{result['tokens_per_batch']:,} tokens, {loss}: commit "
                     f"`{result['commit']}`, {result['pairs']:,} pairs"
                     + (f" ({result['corpus_gb']:.1f} GB of text)" if "corpus_gb" in result
                        else "")
                     + f", {result['backend']}, a token cache of {result['cache_mb']:,.0f} MiB"
                     + _cache_parts(result.get("cache_files_mb")))
    source, target = runs[0]["multi30k_padding"]
    return "\n\n".join([
        run_all.table(("tokens a side", "loss", "run", "peak RSS: data ready / whole run",
                       "with child processes", *(names.get(label, label) for label in labels),
                       "padding, source / target"), rows),
        "Runs: " + "; ".join(notes) + f". The Multi30k recipe pads {source}% / {target}% of "
        "its own training split.",
        "Resident memory (VmRSS) as each line came, and in parentheses the part of it that is "
        "mapped files' pages (RssFile):\n\n" + "\n".join(memory)])


def lowest_versions(kind, record):
    """.ci/lowest_versions.py's record (`--output`): where and on what it ran, each
    backend's result and time, and the versions it installed."""
    results = ", ".join(f"{BACKEND_NAMES[run['backend']]} "
                        f"{'passed' if run['passed'] else 'FAILED'} "
                        f"({duration(run['seconds'])})" for run in record["backends"])
    return (f"`{record['command']}` at commit `{record['commit']}`, on {record['cores']} cores "
            f"of {_machine(record)}, Python {record['python']}: {results}; "
            f"{duration(record['seconds'])} with the install. Installed: "
            + ", ".join(f"{name} {version}" for name, version in record["installed"].items())
            + ".")


def _cache_parts(files):
    """" (ids 448 MiB, offsets 69 MiB)": a token cache's files (wmt14_scale.py's
    `cache_files_mb`, {"source_ids.npy": MiB, ...}) summed by kind; "" for a run that
    predates them."""
    if not files:
        return ""
    parts = {kind: sum(mb for name, mb in files.items() if f"_{kind}." in name)
             for kind in ("ids", "offsets")}
    return " (" + ", ".join(f"{kind} {mb:,.0f} MiB" for kind, mb in parts.items()) + ")"


def quickstart(kind, record):
    """The quickstart's run (`--record ... --wall-seconds`): its command, commit and
    machine, the whole command's time, training, the two evaluations, and the scores of
    the last checkpoint and of the averaged model."""
    import run_all

    made, averaged = record["provenance"], record["averaged"]
    evaluations = " + ".join(f"{result['test_sentences'] / result['sentences_per_second']:.1f} s"
                             for result in (record, averaged))
    row = (duration(record["wall_seconds"]),
           f"{record['train_seconds']:.0f} s "
           f"({record['train_seconds'] / record['steps']:.3f} s a step)",
           evaluations,
           f"{record['exact_match']:.1%} / {record['bleu']:.2f}",
           f"{averaged['exact_match']:.1%} / {averaged['bleu']:.2f}")
    machine = f"{made['cpu']} ({made['isa']})"
    return (f"{_ran(made, machine)}:\n\n" + run_all.table(
                ("start to exported model", f"training ({record['steps']} steps)",
                 f"evaluation (2 × {record['test_sentences']} sentences)",
                 "exact match / BLEU", "averaged model: exact match / BLEU"), [row]))


def recipe_run(kind, record):
    """One recorded recipe run (`--record`): its command, commit and machine, then its
    steps, training time, the test sentences and their references, the BLEU of the last
    checkpoint (and, where a sentence has several references, of each pair scored against
    its own reference alone) and of the averaged model, cased / lower-cased, and its α."""
    import run_all

    made, averaged = record["provenance"], record["averaged"]

    def bleu(result):
        return f"{result['bleu']:.2f} / {result['bleu_lowercase']:.2f}"

    header = ["steps", "training", "test sentences (references)", "BLEU cased / lower-cased"]
    row = [record["steps"], duration(record["train_seconds"]),
           f"{record['test_sentences']:,} ({record['test_references']:,})", bleu(record)]
    if "per_pair" in record:
        header.append("one reference per pair")
        row.append(bleu(record["per_pair"]))
    header += ["averaged", "α"]
    row += [bleu(averaged), f"{record['alpha']:g}"]
    return (f"{_ran(made, _machine(made))}, under {BACKEND_NAMES[record['backend']]}:\n\n"
            + run_all.table(header, [row]))


# Table 3's columns of a variant's shape: (key of a row, its name in the "change" cell).
_TABLE3_FIELDS = (("N", "N"), ("d_model", "d_model"), ("d_ff", "d_ff"), ("h", "h"),
                  ("d_k", "d_k"), ("d_v", "d_v"), ("dropout", "P_drop"),
                  ("label_smoothing", "ε_ls"), ("positions", "positions"))


def table3(kind, results):
    """`recipes.table3`'s results.json: its command, commit and machine, then a row per
    variant: its Table 3 row, what it changes from the base row (the base row: all of its
    shape), parameters, steps in its minutes, dev perplexity and BLEU cased / lower-cased."""
    import run_all

    made, rows = results["provenance"], results["variants"]
    base = next((row for row in rows if not row["group"]), None)
    if base is None:  # what each row changes is read against it
        raise ValueError(f"table3's results of {made['command']!r} hold no base row: run the "
                         "variants with `base` among them")

    def change(row):
        differ = {key for key, _ in _TABLE3_FIELDS if row is base or row[key] != base[key]}
        together = {"d_k", "d_v"} <= differ and row["d_k"] == row["d_v"]  # one cell for both
        cells = []
        for key, name in _TABLE3_FIELDS:
            if key not in differ or (together and key == "d_v"):
                continue
            if key == "positions":
                cells.append(f"{row[key]} positions")
            else:
                cells.append(f"{'d_k=d_v' if together and key == 'd_k' else name}={row[key]:g}")
        return ", ".join(cells)

    table = run_all.table(
        ("variant", "Table 3 row", "change", "parameters", f"steps in {results['minutes']:g} min",
         "dev PPL", "dev BLEU cased / lower-cased"),
        [(row["variant"], row["group"] or "base", change(row), f"{row['parameters']:,}",
          row["steps"], f"{row['dev_perplexity']:.1f}",
          f"{row['dev_bleu']:.2f} / {row['dev_bleu_lowercase']:.2f}") for row in rows])
    sentences = {row["dev_sentences"] for row in rows}
    return (f"{_ran(made, _machine(made))}, under {BACKEND_NAMES[base['backend']]}; BLEU on "
            f"the first {'/'.join(map(str, sorted(sentences)))} validation sentences:\n\n"
            + table)


def _ran(made, machine):
    """"`COMMAND` at commit `C`, on N cores of MACHINE": where a recorded run ran."""
    return (f"`{made['command']}` at commit `{made['commit']}`, on {made['cores']} cores of "
            f"{machine}")


def _machine(made, article=True):
    """"an Intel Xeon (AVX-512)": the CPU a results file names, and its widest instruction
    set ("Intel Xeon (AVX-512)" without `article`)."""
    import re

    cpu = re.sub(r"\((?:R|TM)\)|\s+(?:Processor|CPU\b.*|\d+-Core.*)$", "", made["cpu"]).strip()
    machine = f"{cpu} ({made['isa']})"
    return f"{'an' if cpu[:1] in 'AEIOU' else 'a'} {machine}" if article else machine


def load(path):
    """A results file (JSON, or JSON lines as a list) or a folder of them, in name order:
    what a table is made from (`tables.render`, and each row of README's results)."""
    import os

    if os.path.isdir(path):
        return [load(os.path.join(path, name)) for name in sorted(os.listdir(path))]
    with open(path, encoding="utf-8") as file:
        if path.endswith(".jsonl"):
            return [json.loads(line) for line in file if line.strip()]
        return json.load(file)


def _bleu(record, row):
    """A Multi30k record (`--record`): test2016 BLEU of the last checkpoint and of the
    averaged model."""
    made = record["provenance"]
    return (f"lower-cased BLEU **{record['bleu_lowercase']:.2f}**, averaged "
            f"**{record['averaged']['bleu_lowercase']:.2f}** ({BACKEND_NAMES[record['backend']]}, "
            f"{record['steps']:,} steps, commit `{made['commit']}`, {_machine(made)})")


def _quickstart(record, row):
    made = record["provenance"]
    return (f"{record['exact_match']:.1%} exact match, BLEU {record['bleu']:.2f}, "
            f"{duration(record['wall_seconds'])} from start to exported model "
            f"({BACKEND_NAMES[record['backend']]}, commit `{made['commit']}`, {_machine(made)})")


def _gpu(lines, row):
    """gpu_all.sh's JSON lines: the named run's tokens a second and its ratio to the
    `torch.compile`d peer; the lines name no commit, so the row gives the one it ran."""
    [result] = [line["result"] for line in lines if line["run"] == row["run"]]
    return (f"{result['config']} model {result['tokens_per_s']:,.0f} target tokens/s, "
            f"{result['peers']['compile']['ours_over_peer']:.2f}× the peer "
            f"(commit `{row['commit']}`, torch {result['peers']['compile']['torch']})")


def _decoding_peers(runs, row):
    """A folder of `decoding.py --ctranslate2` runs: the range, over every length and the
    cached search and SavedModel of the row's `backends`, of ours / CTranslate2 fp32 in beam
    search."""
    runs = [run for run in runs if run["backend"] in row["backends"]]
    ratios = [value for run in runs
              for name, by_length in run["summary"]["ours_over_ctranslate2"].items()
              if name in ("beam_fp32", "beam_saved_model_fp32") for value in by_length.values()]
    [commit] = {run["commit"] for run in runs}
    return (f"{min(ratios):.2f}–{max(ratios):.2f}× CTranslate2 fp32's time per token "
            f"(beam {runs[0]['beam_size']}, commit `{commit}`, {_machine(runs[0]['machine'])})")


def _serving(results, row):
    """serving.py's results: sentences a second at the row's clients, batching on."""
    [load] = [load for load in results["load"]
              if load["clients"] == row["clients"] and load["batching"] == "on"]
    return (f"{load['sentences_per_s']:,.0f} sentences/s from the SavedModel, batching on "
            f"(commit `{results['commit']}`, {_machine(results['machine'])})")


def _wmt14_scale(result, row):
    """A `wmt14_scale.py --output` file: its first run's peak and time to the first step."""
    run = result["runs"][0]
    return (f"{run['peak_rss_gb']:.2f} GiB peak for the whole run, first step after "
            f"{duration(run['phases_s']['first steps'])} ({result['tokens_per_batch']:,} "
            f"tokens a side, commit `{result['commit']}`, {_machine(result['machine'])})")


_HEADLINES = {"bleu": _bleu, "quickstart": _quickstart, "gpu": _gpu,
              "decoding_peers": _decoding_peers, "serving": _serving,
              "wmt14_scale": _wmt14_scale}


HEADLINES = "docs/results/headlines.json"


def _headline(name, root):
    """The row of README's table (`HEADLINES` under `root`) whose `name` is `name`: a page's
    table names it instead of its record, so which run is, say, a recipe's default is
    declared once."""
    rows = {row["name"]: row for row in load(os.path.join(root, HEADLINES))["rows"]
            if "name" in row}
    if name not in rows:
        raise ValueError(f"{HEADLINES} has no row named {name!r}; named: {', '.join(rows)}")
    return rows[name]


def headlines(kind, spec, root=None):
    """README's table of results: a row per entry of `spec` (docs/results/headlines.json),
    its figure made from the results file it names (`from`, a path from `root`, the
    repository's by default) by the entry's `figure`; an entry may name one of README's rows
    (`headline`) for its `from` and `figure` instead, as docs/results/multi30k-defaults.json
    does."""
    import run_all

    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = []
    for row in spec["rows"]:
        if "headline" in row:  # README's row of that name gives the record and its figure
            row = {**_headline(row["headline"], root), **row}
        if row["figure"] not in _HEADLINES:
            raise ValueError(f"{row['what']}: no figure is made by {row['figure']!r}; known: "
                             f"{', '.join(_HEADLINES)}")
        rows.append((row["what"], _HEADLINES[row["figure"]](load(os.path.join(root, row["from"])),
                                                            row), row["where"]))
    return run_all.table(("what", "result", "where"), rows)
