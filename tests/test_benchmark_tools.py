"""The report that benchmarks/run_all.py writes: only the sections of the
scripts that ran, and a rerun that keeps the hand-written sections of
benchmarks/RESULTS.md without bringing dated history back; the tables that
benchmarks/tables.py makes again from their results files (every page's, checked
here); and what a result records of where it comes from."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPOSITORY, benchmark_module

# What is tested here does not depend on the backend: it runs in one pass.
pytestmark = pytest.mark.once("torch")

RESULTS = os.path.join(REPOSITORY, "benchmarks", "RESULTS.md")


@pytest.fixture(scope="module")
def run_all():
    return benchmark_module("run_all")


def training_result(ratio):
    model = {"params": 1000, "tokens_per_s": 2000.0, "median_step_s": 0.4, "first_step_s": 5.0,
             "peak_rss_mb": 1100.0, "gflops": 120.0, "jit_compile": True}
    return {"ratios": {"ours/keras_hub": ratio}, "results": {"ours": model, "keras_hub": model}}


META = {"machine": {"cpu": "A CPU", "isa": "AVX2", "logical_cores": 2, "usable_cores": 2,
                    "os": "Linux", "python": "3.11.7"},
        "versions": {"keras": "3"}, "backends": ["jax"], "commit": "abcdef1",
        "command": "python benchmarks/run_all.py", "minutes": 1, "quick": False,
        "results_file": "benchmarks/RESULTS.json"}


def report(run_all, results):
    return run_all.report({**results, "meta": META})


def headings(text):
    return [line for line in text.splitlines() if line.startswith("#")]


def test_report_leaves_out_the_scripts_that_did_not_run(run_all):
    results = {
        "matmul": {"gflops": {"numpy": {"square": 200.0, "ffn": 180.0, "threads": None}},
                   "shapes": {"square": [2048] * 3, "ffn": [1024, 512, 2048]},
                   "best_gflops": 200.0},
        ("training", "jax", "default"): training_result(1.25),
        ("training", "jax", "large"): training_result(0.9),
        ("gpu", "jax"): {"skipped": True, "reason": "No GPU visible to the jax backend"},
    }
    text = report(run_all, results)
    assert headings(text) == ["# Benchmark results", "## Targets", "## Matmul rate (float32)",
                              "## Training throughput"]
    assert "- GPU: none visible here (`gpu.py` skipped)." in text
    targets = text.split("## Targets")[1].split("## ")[0]
    assert "| training tokens/s ours / keras-hub (default) | jax | 1.25 | ≥ 1.2 | PASS |" in targets
    assert "| training tokens/s ours / keras-hub (large) | jax | 0.90 | ≥ 1.2 | FAIL |" in targets
    assert "cached" not in targets  # decoding did not run: no decoding rows
    assert "- Machine: A CPU (AVX2), 2 logical cores" in text
    assert "Measured at commit `abcdef1`." in text


def test_run_alls_tables_are_made_again_from_its_json(run_all, tables, tmp_path):
    results = {("training", "jax", "default"): training_result(1.25), "meta": META}
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "RESULTS.md").write_text(run_all.report(results))
    (tmp_path / "benchmarks" / "RESULTS.json").write_text(json.dumps(
        {" ".join(k) if isinstance(k, tuple) else k: v for k, v in results.items()}))
    made = [kind for _, _, kind, _ in
            tables.blocks((tmp_path / "benchmarks" / "RESULTS.md").read_text())]
    assert made == ["run_all.header", "run_all.targets", "run_all.training"]
    assert tables.differences(str(tmp_path)) == []


def test_a_rerun_keeps_the_hand_written_sections_and_drops_the_analysis(run_all):
    with open(RESULTS) as file:
        current = file.read()
    sections = [h for h in headings(current) if h.startswith("## ")]
    analysis = sections.index("## Analysis of the targets (written by hand for the run above)")
    kept = run_all._kept_sections(RESULTS)
    assert [h for h in headings(kept) if h.startswith("## ")] == sections[analysis + 1:]
    rerun = report(run_all, {}) + kept
    assert rerun.count(run_all.INTRODUCTION) == 1 and current.count(run_all.INTRODUCTION) == 1


def test_results_md_has_no_dated_headings():
    with open(RESULTS) as file:
        dated = [h for h in headings(file.read()) if re.search(r"\d{4}-\d{2}-\d{2}|\d{2}:\d{2}", h)]
    assert dated == []


def test_run_all_keeps_every_section_it_does_not_write(run_all, tmp_path):
    report = tmp_path / "RESULTS.md"
    report.write_text(
        "# Benchmark results\n\n- Date: then\n\n"
        "## Targets\n\nold targets\n\n"
        "## GPU\n\n| skipped |\n\n"
        "## Analysis of the targets (written by hand for the run above)\n\nstale\n\n"
        "## GPU: fit on a real GPU (by hand)\n\nkept 1\n\n### a subsection\n\nkept 2\n\n"
        "## Serving (benchmarks/serving.py)\n\nkept 3\n")
    kept = run_all._kept_sections(str(report))
    assert [line for line in kept.splitlines() if line.startswith("## ")] == [
        "## GPU: fit on a real GPU (by hand)", "## Serving (benchmarks/serving.py)"]
    assert "kept 1" in kept and "### a subsection" in kept and "kept 3" in kept
    assert "old targets" not in kept and "stale" not in kept and "skipped" not in kept
    assert run_all._kept_sections(str(tmp_path / "missing.md")) == ""


@pytest.fixture(scope="module")
def tables():
    return benchmark_module("tables")


def test_every_generated_table_says_what_its_results_file_says(tables):
    assert tables.differences() == []


def test_a_figure_changed_by_hand_is_found_and_written_again(tables, tmp_path):
    import shutil

    (tmp_path / "benchmarks").mkdir()
    for name in ("RESULTS.md", "RESULTS.json"):
        (tmp_path / "benchmarks" / name).write_text(
            open(os.path.join(REPOSITORY, "benchmarks", name), encoding="utf-8").read())
    page = tmp_path / "benchmarks" / "RESULTS.md"
    text = page.read_text()
    for source in {source for _, source, _, _ in tables.blocks(text)}:  # what its blocks read
        copy, original = tmp_path / source, os.path.join(REPOSITORY, source)
        if not copy.exists():
            copy.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if os.path.isdir(original) else shutil.copyfile)(original, copy)
    # A row of the matmul table, as RESULTS.json gives it, with its first figure changed.
    [row] = [line for line in tables.render("benchmarks/RESULTS.json", "run_all.matmul",
                                            str(tmp_path)).splitlines()
             if line.startswith("| jax | ")]
    assert text.count(row) == 1
    figure = row.split(" | ")[1]
    page.write_text(text.replace(row, row.replace(f"| {figure} |", f"| {figure}1 |", 1)))
    [entry] = tables.differences(str(tmp_path))
    assert entry.startswith("benchmarks/RESULTS.md:") and "run_all.matmul" in entry
    assert tables.write(str(tmp_path)) == ["benchmarks/RESULTS.md"]
    assert page.read_text() == text and tables.differences(str(tmp_path)) == []


def test_a_block_without_its_end_or_of_an_unknown_kind_is_an_error(tables):
    opening = tables.begin("benchmarks/RESULTS.json", "run_all.matmul")
    with pytest.raises(ValueError, match="line 2: a generated block without"):
        tables.blocks(f"text\n{opening}\n| a |\n")
    with pytest.raises(ValueError, match="no table is made by 'nothing'"):
        tables.render("benchmarks/RESULTS.json", "nothing")


@pytest.fixture(scope="module")
def common():
    return benchmark_module("common")


def test_the_avx2_cap_sets_every_engines_variable_and_keeps_other_xla_flags(common):
    capped = common.capped_environment("AVX2", {"XLA_FLAGS": "--xla_dump_to=/tmp/x", "A": "1"})
    assert capped["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_cpu_max_isa=AVX2"
    assert (capped["ONEDNN_MAX_CPU_ISA"], capped["ATEN_CPU_CAPABILITY"],
            capped["CT2_FORCE_CPU_ISA"]) == ("AVX2", "avx2", "AVX2")
    assert capped[common.ISA_CAP_VARIABLE] == "AVX2" and capped["A"] == "1"
    assert common.capped_environment("AVX2", {})["XLA_FLAGS"] == "--xla_cpu_max_isa=AVX2"


def test_max_isa_is_read_from_the_command_line_and_recorded(common, monkeypatch):
    assert common.max_isa_of(["--lengths", "32", "--max-isa", "AVX2"]) == "AVX2"
    assert common.max_isa_of(["--max-isa=AVX2"]) == "AVX2"
    assert common.max_isa_of(["--lengths", "32"]) is None
    parser = common.argument_parser("A benchmark.\n\n    python x.py")
    assert parser.parse_args(["--max-isa", "AVX2"]).max_isa == "AVX2"
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-isa", "SSE2"])
    monkeypatch.setenv(common.ISA_CAP_VARIABLE, "AVX2")  # as in the process run again
    assert common.machine()["isa_cap"] == "AVX2"
    monkeypatch.delenv(common.ISA_CAP_VARIABLE)
    assert common.machine()["isa_cap"] is None


def test_a_result_records_its_commit_command_and_machine(common, capsys, monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.setattr(sys, "argv", [os.path.join(REPOSITORY, "benchmarks", "matmul.py"),
                                      "--lengths", "32 64"])
    common.emit({"x": 1})
    common.emit({"commit": "its own"})  # serving.py names the commit of its server
    first, second = [json.loads(line) for line in capsys.readouterr().out.splitlines()[-2:]]
    assert first["command"] == "KERAS_BACKEND=jax python benchmarks/matmul.py --lengths '32 64'"
    assert first["commit"] == common.commit() != "unknown commit"
    assert first["machine"]["isa"] in ("AVX-512", "AVX2", "other") and first["x"] == 1
    assert second["commit"] == "its own"


def test_the_gpu_table_has_a_row_per_model_and_peer_and_says_which_runs_failed(tables):
    result = {"backend": "jax", "config": "base", "params": 63_119_496, "median_step_s": 0.039,
              "tokens_per_s": 639_027.4, "achieved_tflops": 246.6, "mfu": 0.2494,
              "peak_gpu_memory_mb": 12_779.6, "first_window_s": 29.22}
    peer = {**result, "tokens_per_s": 540_323.8, "ours_over_peer": 1.1827}
    lines = [{"run": "jax-base-bf16", "wall_s": 141,
              "result": {**result, "peers": {"compile": peer}}},
             {"run": "torch-base-bf16-compiled", "wall_s": 137, "exit_status": 124}]
    text = tables.KINDS["gpu"]("gpu", lines).splitlines()
    assert text[2] == ("| ours, JAX (`jax-base-bf16`) | base (63.1M) | 39.0 | 639,027 | 246.6 | "
                       "24.9% | 12,780 | 29.2 s |")
    assert text[3].startswith("| torch.nn.Transformer, `torch.compile` (`jax-base-bf16`) |")
    assert "`jax-base-bf16` 1.183 × the compiled peer." in text[5]
    assert text[7] == "Not measured: `torch-base-bf16-compiled` ended with status 124 after 137 s."


def test_a_table_of_trials_is_made_from_the_records_of_finished_runs(tables, tmp_path):
    from keras_transformer_app import run_files

    run_dir = tmp_path / "runs" / "pre-d03"
    run_dir.mkdir(parents=True)
    command = ("KERAS_BACKEND=tensorflow python -m recipes.multi30k --direction en-de --data-dir "
               "d --run-dir r --verbose 2 --no-export --norm-position pre --dropout-rate 0.3")
    results = {"steps": 2400, "train_seconds": 3725.4, "bleu_lowercase": 38.5,
               "averaged": {"bleu_lowercase": 38.61},
               "alpha_tuning": {"alpha": 1.2, "bleu_lowercase": {"1.0": 40.0, "1.2": 40.3}}}
    (run_dir / run_files.RESULTS).write_text(json.dumps(results))
    with open(run_files.path(str(run_dir), run_files.TRAINING_LOG), "w") as file:
        file.write("epoch,step,val_loss\n0,1000,3.1\n1,2400.0,2.9\n")
    trials = tmp_path / "docs" / "results" / "en-de"
    trials.mkdir(parents=True)
    with pytest.raises(ValueError, match="names no provenance"):
        tables.record(str(run_dir), str(trials / "01-pre-d03.json"), "pre-norm, dropout 0.3")
    tables.record(str(run_dir), str(trials / "01-pre-d03.json"), "pre-norm, dropout 0.3",
                  {"commit": "abcdef1", "command": command})
    page = tmp_path / "docs" / "results.md"
    page.write_text(f"# Results\n\n{tables.begin('docs/results/en-de', 'trials')}\n"
                    f"{tables.END}\n")
    assert tables.write(str(tmp_path)) == ["docs/results.md"]
    assert page.read_text().splitlines()[5] == (
        "| pre-norm, dropout 0.3 | `--norm-position pre --dropout-rate 0.3` | commit `abcdef1` "
        "| 2400 | 3.100 / 2.900 / – | 2.900 | 40.30 (1.2) | 38.50 / 38.61 | 1 h 2 min 5 s |")
    assert tables.differences(str(tmp_path)) == []


def test_a_table_of_clusters_is_made_from_the_records_of_their_runs(tables, tmp_path):
    from keras_transformer_app import run_files

    folder = tmp_path / "docs" / "results" / "clusters"
    folder.mkdir(parents=True)
    logs = {"one": "epoch,step,loss,val_loss\n0,5.0,7.4003911,7.1\n1,10.0,7.2877664,6.8371052\n",
            "two": "epoch,step,loss,val_loss\n0,5.0,7.4003911,7.1\n1,10.0,7.2877642,6.8371091\n",
            "short": "epoch,step,loss,val_loss\n0,5.0,7.4,7.1\n"}
    for index, (name, log) in enumerate(logs.items()):
        run_dir = tmp_path / "runs" / name
        run_dir.mkdir(parents=True)
        (run_dir / run_files.RESULTS).write_text(json.dumps(
            {"backend": "jax", "train_seconds": 447.2,
             "provenance": {"commit": "abcdef1", "command": "python -m recipes.multi30k"}}))
        (run_dir / run_files.TRAINING_LOG).write_text(log)
        tables.record(str(run_dir), str(folder / f"{index}-{name}.json"), f"run {name}")
    records = [json.loads((folder / f"{index}-{name}.json").read_text())
               for index, name in enumerate(logs)]
    assert records[0]["training_loss"] == {"5": 7.4003911, "10": 7.2877664}
    assert records[0]["validation_loss"]["10"] == 6.8371052  # every digit the log has
    text = tables.KINDS["clusters"]("clusters", records[:2])
    assert text.splitlines() == [
        "| backend | run | step 5 | step 10 | validation loss, step 10 | training |",
        "| --- | --- | --- | --- | --- | --- |",
        "| JAX | run one | 7.400391 | 7.287766 | 6.837105 | 7 min 27 s |",
        "| JAX | run two | 7.400391 | 7.287764 | 6.837109 | 7 min 27 s |"]
    with pytest.raises(ValueError, match="run short: its windows end at other steps"):
        tables.KINDS["clusters"]("clusters", records)


def test_wmt14_scale_runs_make_the_table_of_memory_and_time(tables):
    def result(tokens, chunk):
        run = {"steps": 1, "peak_rss_gb": 2.891, "with_children_peak_rss_gb": 2.9,
               "data_peak_rss_gb": 2.305, "padding": [8, 10],
               "phases_s": {"read": 4.2, "sampled": 9.0, "vocabulary": 33.4, "tokenized": 205,
                            "planned": 205.4, "first steps": 232.0},
               "rss_gb": {"read": 0.594, "first steps": 2.64}, "file_gb": {"read": 0.35}}
        second = {**run, "steps": 2, "phases_s": {"read": 5, "vocabulary": 5.2,
                                                  "tokenized": 7, "planned": 8,
                                                  "first steps": 33}}
        return {"commit": "abcdef1", "pairs": 4_500_000, "backend": "tensorflow",
                "tokens_per_batch": tokens, "loss_chunk_size": chunk, "cache_mb": 516.2,
                "multi30k_padding": [13, 16], "runs": [run, second]}

    text = tables.KINDS["wmt14_scale"]("wmt14_scale", [result(2048, 1024), result(4096, 0)])
    lines = text.splitlines()
    assert lines[0] == ("| tokens a side | loss | run | peak RSS: data ready / whole run | with "
                        "child processes | corpus read | sample drawn | vocabulary | tokenized "
                        "| batches planned | first steps | padding, source / target |")
    assert lines[2] == ("| 2,048 | chunks of 1,024 | first | 2.31 / 2.89 GiB | 2.90 GiB | 4 s | "
                        "9 s | 33 s | 3 min 25 s | 3 min 25 s | 3 min 52 s | 8% / 10% |")
    assert lines[3].startswith("| 2,048 | chunks of 1,024 | second (reads the cache) |")
    assert "| 5 s | — | 5 s |" in lines[3]
    assert lines[5].startswith("| 4,096 | whole logits | second (reads the cache) |")
    assert lines[-4] == ("- 2,048 tokens, chunks of 1,024, first run: corpus read 0.59 GiB "
                         "(0.35), first steps 2.64 GiB")
    assert lines[-2].startswith("- 4,096 tokens, whole logits, first run: ")
    assert lines[-1].startswith("- 4,096 tokens, whole logits, second run: ")
    assert lines[-8] == (
        "Runs: 2,048 tokens, chunks of 1,024: commit `abcdef1`, 4,500,000 pairs, tensorflow, a "
        "token cache of 516 MiB; 4,096 tokens, whole logits: commit `abcdef1`, 4,500,000 pairs, "
        "tensorflow, a token cache of 516 MiB. The Multi30k recipe pads 13% / 16% of its own "
        "training split.")
    # A run that records its corpus's size and its cache's files says what they hold.
    newer = {**result(2048, 1024), "corpus_gb": 1.2449, "cache_files_mb": {
        "manifest.json": 0.01, "source_ids.npy": 230.1, "source_offsets.npy": 34.3,
        "target_ids.npy": 217.5, "target_offsets.npy": 34.3}}
    [runs] = [line for line in tables.KINDS["wmt14_scale"]("wmt14_scale", [newer]).splitlines()
              if line.startswith("Runs: ")]
    assert runs.startswith("Runs: 2,048 tokens, chunks of 1,024: commit `abcdef1`, 4,500,000 "
                           "pairs (1.2 GB of text), tensorflow, a token cache of 516 MiB (ids "
                           "448 MiB, offsets 69 MiB). ")


def _ci_times():
    import importlib.util

    spec = importlib.util.spec_from_file_location("ci_times", f"{REPOSITORY}/.ci/times.py")
    ci_times = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ci_times)
    return ci_times


def test_a_timed_command_is_a_record_of_one_stage_and_a_failed_one_none(tmp_path):
    """`.ci/times.py --time` (installation.md's quick loop): the command's seconds and the
    line its pytest run adds under CI_TIMES make one stage; its status is passed on."""
    ci_times = _ci_times()
    output = tmp_path / "quick.json"
    pytest_line = ('echo \'{"stage": "command", "tests": {"seconds": 5, "own_cpu": 3, '
                   '"started_cpu": 1}}\' >> "$CI_TIMES"')
    assert ci_times.time_command(str(output), f"{pytest_line} && sleep 0.2") == 0
    record = json.loads(output.read_text())
    assert record["command"] == f"{pytest_line} && sleep 0.2" and record["commit"]
    [stage] = record["stages"]
    assert stage["stage"] == "command" and stage["tests"]["own_cpu"] == 3
    assert 0.2 <= stage["seconds"] < 10
    assert ci_times.time_command(str(tmp_path / "failed.json"), "exit 3") == 3
    assert not (tmp_path / "failed.json").exists()


def test_cis_record_of_its_stages_makes_the_tables_of_ci_time(tables, tmp_path, monkeypatch):
    """.ci/run's lines (a stage's seconds; a pytest run's split, from tests/cpu_time.py)
    become .ci/times.py's record, and the record installation.md's tables."""
    ci_times = _ci_times()
    seconds = {"install": 8, "ruff": 0, "lint-imports": 1, "suite (tensorflow)": 285,
               "suite (jax)": 249, "suite (torch)": 253, "walk": 401, "walk's tables": 4,
               "figures --check": 5}
    lines = tmp_path / "times.jsonl"
    with open(lines, "w") as file:
        for stage, value in seconds.items():
            if stage == "suite (jax)":  # the pytest run's own line comes before its stage's
                file.write(json.dumps({"stage": stage, "tests": {
                    "seconds": 521, "own_cpu": 265, "started_cpu": 171}}) + "\n")
            if stage == "walk":  # its tests are its pages, "@" their chain (--dist loadgroup)
                page = "tests/test_pages.py::test_the_page_runs[{}]@{}".format
                file.write(json.dumps({"stage": stage, "tests": {
                    "seconds": 760, "own_cpu": 1, "started_cpu": 700}, "slowest": {
                    page("docs/results.md", "multi30k"): 301.4, page("docs/wmt14.md", "wmt14"):
                    189.6, page("docs/translation.md", "multi30k"): 120.2,
                    page("README.md", "quickstart"): 99.0, "tests/test_x.py::test_y": 3.0,
                    page("docs/serving.md", "quickstart"): 50.3}}) + "\n")
            file.write(json.dumps({"stage": stage, "seconds": value}) + "\n")
    monkeypatch.setenv("CI", "true")
    ci_times.main(str(lines), str(tmp_path / "times.json"))
    record = json.loads((tmp_path / "times.json").read_text())
    assert record["command"] == "CI=true bash .ci/run" and record["commit"]
    with pytest.raises(ValueError, match="lacks the stages all"):
        tables.KINDS["ci"]("ci", [record])
    record["stages"].append({"stage": "all", "seconds": 1206})
    # A folder of records, from two CPUs: a column each.
    # (the other's record, like those from before CI kept its tests' times, has no pages)
    other = {**record, "commit": "abc1234", "cpu": "AMD EPYC", "isa": "AVX2", "stages": [
        {**{key: value for key, value in stage.items() if key != "slowest"},
         "seconds": 2 * stage["seconds"]} for stage in record["stages"]]}
    text = tables.KINDS["ci"]("ci", [record, other])
    assert text.startswith(f"- `CI=true bash .ci/run` at commit `{record['commit']}`, on ")
    assert (f"\n- `CI=true bash .ci/run` at commit `abc1234`, on {other['cores']} cores of "
            "AMD EPYC (AVX2)\n") in text
    machine = tables.records._machine(record).split(" ", 1)[1]  # "Intel Xeon (AVX-512)"
    assert (f"| stage | {machine}, commit `{record['commit']}` | AMD EPYC (AVX2), commit "
            "`abc1234` |") in text
    assert "| the suite, JAX pass | 249 | 498 |" in text
    assert ("| **the README's test command** (the six above) | **796** (13.3 min) | "
            "**1,592** (26.5 min) |") in text
    assert "| **all of `.ci/run`** | **1,206** (20.1 min) | **2,412** (40.2 min) |" in text
    assert "| the suite, JAX pass | AMD EPYC (AVX2) | 521 | 265 | 171 | 85 |\n" in text
    # The walk's chains, from the record that keeps its pages (the other's column is left
    # out): the longest chain first, then its pages, slowest first.
    chains = text[text.index("| chain, then its pages"):].splitlines()
    assert chains[0] == f"| chain, then its pages | {machine}, commit `{record['commit']}` |"
    # (a chain's total is the sum of its rows)
    assert chains[2:] == ["| **multi30k** | **421** |", "| docs/results.md | 301 |",
                          "| docs/translation.md | 120 |", "| **wmt14** | **190** |",
                          "| docs/wmt14.md | 190 |", "| **quickstart** | **149** |",
                          "| README.md | 99 |", "| docs/serving.md | 50 |"]
    # Two records with pages: a column each, "–" where a record lacks a page or a chain.
    third = {**other, "commit": "def5678", "stages": [
        {**stage, "slowest": {page("docs/results.md", "multi30k"): 200.2,
                              page("docs/distributed.md", "distributed"): 88.0}}
        if stage["stage"] == "walk" else stage for stage in other["stages"]]}
    chains = tables.KINDS["ci"]("ci", [record, third]).split("| chain, then its pages")[1]
    assert chains.splitlines()[2:] == [
        "| **multi30k** | **421** | **200** |", "| docs/results.md | 301 | 200 |",
        "| docs/translation.md | 120 | – |", "| **wmt14** | **190** | – |",
        "| docs/wmt14.md | 190 | – |", "| **quickstart** | **149** | – |",
        "| README.md | 99 | – |", "| docs/serving.md | 50 | – |",
        "| **distributed** | – | **88** |", "| docs/distributed.md | – | 88 |"]
    assert "chain, then its pages" not in tables.KINDS["ci"]("ci", [other])


def test_decoding_runs_against_ctranslate2_make_the_peers_tables(tables):
    """decoding.py --ctranslate2 --output files, one per backend: our times, the
    SavedModel's where the run had one, CTranslate2's, and ours / CTranslate2 fp32."""
    def run(backend, saved_model):
        methods = ["greedy_cached", "beam_cached", "greedy_ct2_fp32", "beam_ct2_fp32",
                   "greedy_ct2_int8", "beam_ct2_int8"]
        methods += ["greedy_saved_model", "beam_saved_model"] if saved_model else []
        ms = {method: {"32": 1.0 + i, "64": 2.0 + i} for i, method in enumerate(methods)}
        ratios = {f"{search}{path}_fp32": {"32": 1.25 + i, "64": 1.5 + i}
                  for i, (search, path) in enumerate(
                      (search, path) for search in ("greedy", "beam")
                      for path in (("", "_saved_model") if saved_model else ("",)))}
        summary = {"ours_over_ctranslate2": ratios, "greedy_ct2_fp32_matches_cached": 1.0,
                   "ctranslate2_settings": {"fp32": "2 threads, MKL", "int8": "1 thread"}}
        if saved_model:
            summary["greedy_saved_model_matches_cached"] = 0.5
        return {"backend": backend, "beam_size": 4, "lengths": [32, 64], "ms_per_token": ms,
                "summary": summary, "commit": "abc1234", "command": f"{backend} command",
                "machine": {"usable_cores": 2, "cpu": "A CPU", "isa": "AVX2"}}

    text = tables.KINDS["decoding_peers"]("decoding_peers",
                                          [run("jax", False), run("tensorflow", True)])
    assert text.startswith("- `jax command` at commit `abc1234`, on 2 cores of A CPU (AVX2); "
                           "CTranslate2 kept fp32 (2 threads, MKL) and int8 (1 thread)\n")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[0] == "| ms per new token | 32 | 64 |" and rows[2] == "| JAX greedy | 1.00 | 2.00 |"
    assert "| SavedModel beam 4 (TensorFlow run) | 8.00 | 9.00 |" in rows
    assert "| CTranslate2 int8 beam 4 (JAX run) | 6.00 | 7.00 |" in rows
    assert not [row for row in rows if row.startswith("| SavedModel") and "(JAX run)" in row]
    # The ratios: greedy before beam, each run's own, the SavedModel's after TensorFlow's.
    assert rows[rows.index("| ours / CTranslate2 fp32, same run | 32 | 64 |") + 2:] == [
        "| JAX greedy | 1.25 | 1.50 |", "| TensorFlow greedy | 1.25 | 1.50 |",
        "| SavedModel greedy (TensorFlow run) | 2.25 | 2.50 |", "| JAX beam 4 | 2.25 | 2.50 |",
        "| TensorFlow beam 4 | 3.25 | 3.50 |",
        "| SavedModel beam 4 (TensorFlow run) | 4.25 | 4.50 |"]
    assert text.endswith("JAX run 100%, TensorFlow run 100% (SavedModel 50%).")
    with pytest.raises(ValueError, match="same --lengths"):
        tables.KINDS["decoding_peers"]("decoding_peers",
                                       [run("jax", False), {**run("torch", False), "beam_size": 2}])


def test_the_quickstarts_table_is_made_from_its_record(tables, tmp_path):
    """--record with --wall-seconds keeps the command's time, and the table reads it with
    the training, the two evaluations and both models' scores."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = {"test_sentences": 500, "exact_match": 0.968, "bleu": 99.1886}
    (run_dir / "results.json").write_text(json.dumps({
        **result, "steps": 1250, "train_seconds": 171.2, "sentences_per_second": 100.0,
        "averaged": {**result, "exact_match": 0.982, "bleu": 99.6017,
                     "sentences_per_second": 800.0},
        "provenance": {"command": "the command", "commit": "abc1234", "cores": 2,
                       "cpu": "A CPU", "isa": "AVX-512"}}))
    (run_dir / "training_log.csv").write_text("step,val_loss\n1250,1.5\n")
    output = tmp_path / "quickstart.json"
    assert tables.main(["--record", str(run_dir), str(output), "--trial", "quickstart",
                        "--wall-seconds", "200.87"]) == 0
    record = json.loads(output.read_text())
    assert record["wall_seconds"] == 200.87 and record["validation_loss"] == {"1250": 1.5}
    text = tables.KINDS["quickstart"]("quickstart", record)
    assert text.startswith("`the command` at commit `abc1234`, on 2 cores of A CPU (AVX-512):")
    assert text.endswith("| 3 min 21 s | 171 s (0.137 s a step) | 5.0 s + 0.6 s "
                         "| 96.8% / 99.19 | 98.2% / 99.60 |")
    with pytest.raises(SystemExit):
        tables.main(["--wall-seconds", "3"])  # only with --record


def test_a_recipe_runs_table_is_made_from_its_record(tables):
    """A recorded recipe run's table: its command, commit and machine, then its length,
    the test BLEU of the last checkpoint, pair by pair where sentences repeat, and of the
    averaged model."""
    made = {"command": "python -m recipes.anki", "commit": "abc1234", "cores": 2,
            "cpu": "Intel(R) Xeon(R) Processor", "isa": "AVX-512"}
    record = {"backend": "jax", "steps": 1100, "train_seconds": 1267.4, "test_sentences": 5145,
              "test_references": 5978, "bleu": 29.714, "bleu_lowercase": 30.316, "alpha": 0.6,
              "averaged": {"bleu": 18.857, "bleu_lowercase": 19.291}, "provenance": made}
    text = tables.KINDS["recipe_run"]("recipe_run", record)
    assert text.startswith("`python -m recipes.anki` at commit `abc1234`, on 2 cores of an "
                           "Intel Xeon (AVX-512), under JAX:")
    assert text.endswith("| 1100 | 21 min 7 s | 5,145 (5,978) | 29.71 / 30.32 "
                         "| 18.86 / 19.29 | 0.6 |")
    record["per_pair"] = {"bleu": 28.29, "bleu_lowercase": 28.94}
    text = tables.KINDS["recipe_run"]("recipe_run", record)
    assert "| one reference per pair | averaged | α |" in text
    assert text.endswith("| 29.71 / 30.32 | 28.29 / 28.94 | 18.86 / 19.29 | 0.6 |")


def test_table3s_table_says_what_each_variant_changes_from_the_base_row(tables):
    """recipes.table3's results make results.md's table: the base row gives its whole shape,
    every other row only what differs from it (d_k=d_v together where both moved to one
    value, d_k alone where d_v stayed)."""
    made = {"command": "python -m recipes.table3 --minutes 5", "commit": "abc1234", "cores": 2,
            "cpu": "AMD EPYC 7B13", "isa": "AVX2"}
    base = {"variant": "base", "group": "", "N": 3, "d_model": 256, "d_ff": 1024, "h": 4,
            "d_k": 64, "d_v": 64, "dropout": 0.1, "label_smoothing": 0.1,
            "positions": "sinusoidal", "parameters": 7585600, "steps": 284,
            "dev_perplexity": 37.512, "dev_bleu": 10.671, "dev_bleu_lowercase": 10.96,
            "dev_sentences": 400, "backend": "jax"}
    rows = [base, {**base, "variant": "heads1", "group": "A", "h": 1, "d_k": 256, "d_v": 256},
            {**base, "variant": "key_dim_half", "group": "B", "d_k": 32},
            {**base, "variant": "d_model_half", "group": "C", "d_model": 128, "d_k": 32,
             "d_v": 32},
            {**base, "variant": "learned_positions", "group": "E", "positions": "learned"}]
    text = tables.KINDS["table3"]("table3", {"provenance": made, "minutes": 5,
                                             "variants": rows})
    assert text.startswith("`python -m recipes.table3 --minutes 5` at commit `abc1234`, on 2 "
                           "cores of an AMD EPYC 7B13 (AVX2), under JAX; BLEU on the first "
                           "400 validation sentences:")
    lines = text.splitlines()
    assert "| variant | Table 3 row | change | parameters | steps in 5 min |" in lines[2]
    assert lines[4:] == [
        "| base | base | N=3, d_model=256, d_ff=1024, h=4, d_k=d_v=64, P_drop=0.1, ε_ls=0.1, "
        "sinusoidal positions | 7,585,600 | 284 | 37.5 | 10.67 / 10.96 |",
        "| heads1 | A | h=1, d_k=d_v=256 | 7,585,600 | 284 | 37.5 | 10.67 / 10.96 |",
        "| key_dim_half | B | d_k=32 | 7,585,600 | 284 | 37.5 | 10.67 / 10.96 |",
        "| d_model_half | C | d_model=128, d_k=d_v=32 | 7,585,600 | 284 | 37.5 | 10.67 / 10.96 |",
        "| learned_positions | E | learned positions | 7,585,600 | 284 | 37.5 | 10.67 / 10.96 |"]
    with pytest.raises(ValueError, match="hold no base row"):
        tables.KINDS["table3"]("table3", {"provenance": made, "minutes": 5,
                                          "variants": rows[1:]})


def test_a_results_file_records_its_commit_command_and_machine(common, tmp_path, capsys):
    output = tmp_path / "results.json"
    common.write_results({"benchmark": "x"}, str(output))
    written = json.loads(output.read_text())
    assert written == json.loads(capsys.readouterr().out.splitlines()[-1])
    assert {"machine", "commit", "command", "benchmark"} <= set(written)


def test_readmes_results_are_made_from_the_files_their_rows_name(tables, tmp_path):
    """Each row of README's results quotes the results file it names: a Multi30k record,
    the quickstart's, gpu_all.sh's JSON lines (their run by name), a folder of runs against
    CTranslate2 (the row's backends only), serving.py's load at the row's clients and a
    wmt14_scale.py file; a figure of no known kind is an error that names the known."""
    machine = {"cpu": "Intel(R) Xeon(R) Processor", "isa": "AVX-512"}
    made = {**machine, "command": "c", "commit": "abc1234", "cores": 2}
    files = {
        "trial.json": {"backend": "tensorflow", "steps": 8000, "bleu_lowercase": 38.614,
                       "averaged": {"bleu_lowercase": 38.756}, "provenance": made},
        "quickstart.json": {"backend": "jax", "exact_match": 0.9684, "bleu": 99.186,
                            "wall_seconds": 200.6, "provenance": made},
        "serving.json": {"commit": "abc1234", "machine": machine, "load": [
            {"clients": 32, "batching": "off", "sentences_per_s": 400.0},
            {"clients": 32, "batching": "on", "sentences_per_s": 1798.9}]},
        "wmt14.json": {"commit": "abc1234", "machine": {"cpu": "AMD EPYC 7B13", "isa": "AVX2"},
                       "tokens_per_batch": 2048, "runs": [
                           {"peak_rss_gb": 2.7013, "phases_s": {"first steps": 185.1}},
                           {"peak_rss_gb": 2.4, "phases_s": {"first steps": 28.5}}]},
        "peers/1-jax.json": {"backend": "jax", "beam_size": 4, "commit": "abc1234",
                             "machine": machine, "summary": {"ours_over_ctranslate2": {
                                 "beam_fp32": {"32": 1.5, "64": 1.9},
                                 "greedy_fp32": {"32": 1.1, "64": 3.0}}}},
        "peers/2-torch.json": {"backend": "torch", "beam_size": 4, "commit": "abc1234",
                               "machine": machine, "summary": {"ours_over_ctranslate2": {
                                   "beam_fp32": {"32": 2.5, "64": 2.4}}}}}
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(json.dumps(content))
    result = {"config": "base", "tokens_per_s": 629277.6,
              "peers": {"compile": {"ours_over_peer": 1.1908, "torch": "2.13.0"}}}
    (tmp_path / "gpu.jsonl").write_text("\n".join(json.dumps(line) for line in (
        {"run": "other", "result": {**result, "tokens_per_s": 1.0}},
        {"run": "jax-base-bf16", "result": result})) + "\n")
    rows = [{"figure": "bleu", "from": "trial.json"},
            {"figure": "quickstart", "from": "quickstart.json"},
            {"figure": "gpu", "from": "gpu.jsonl", "run": "jax-base-bf16", "commit": "def5678"},
            {"figure": "decoding_peers", "from": "peers", "backends": ["jax"]},
            {"figure": "serving", "from": "serving.json", "clients": 32},
            {"figure": "wmt14_scale", "from": "wmt14.json"}]
    spec = {"rows": [{**row, "what": f"row {n}", "where": "[page](page.md)"}
                     for n, row in enumerate(rows)]}
    xeon = "an Intel Xeon (AVX-512)"
    # Through render, as --write makes it: the rows' files are read from the same repository
    # as the spec, not from this checkout.
    (tmp_path / "headlines.json").write_text(json.dumps(spec))
    cells = [line.split(" | ")[1] for line in
             tables.render("headlines.json", "headlines", str(tmp_path)).splitlines()[2:]]
    assert cells == [
        f"lower-cased BLEU **38.61**, averaged **38.76** (TensorFlow, 8,000 steps, commit "
        f"`abc1234`, {xeon})",
        f"96.8% exact match, BLEU 99.19, 3 min 21 s from start to exported model (JAX, commit "
        f"`abc1234`, {xeon})",
        "base model 629,278 target tokens/s, 1.19× the peer (commit `def5678`, torch 2.13.0)",
        f"1.50–1.90× CTranslate2 fp32's time per token (beam 4, commit `abc1234`, {xeon})",
        f"1,799 sentences/s from the SavedModel, batching on (commit `abc1234`, {xeon})",
        "2.70 GiB peak for the whole run, first step after 3 min 5 s (2,048 tokens a side, "
        "commit `abc1234`, an AMD EPYC 7B13 (AVX2))"]
    with pytest.raises(ValueError, match="no figure is made by 'bleus'; known: bleu, quickstart"):
        tables.records.headlines("headlines", {"rows": [{**spec["rows"][0], "figure": "bleus"}]},
                                 root=str(tmp_path))
    # Another page's table names README's row for its record and figure, with its own words.
    named = {"rows": [{**spec["rows"][0], "name": "trial"}, *spec["rows"][1:]]}
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "headlines.json").write_text(json.dumps(named))
    page = {"rows": [{"what": "the trial", "headline": "trial", "where": "[here](#here)"}]}
    assert tables.records.headlines("headlines", page, root=str(tmp_path)).splitlines()[2] == (
        f"| the trial | {cells[0]} | [here](#here) |")
    with pytest.raises(ValueError, match="has no row named 'trail'; named: trial"):
        tables.records.headlines("headlines", {"rows": [{**page["rows"][0], "headline": "trail"}]},
                                 root=str(tmp_path))


def test_one_command_on_each_backend_makes_a_row_per_backend(tables, tmp_path):
    """results.md's table of the same command on each backend: a row per run's record,
    named by its path or by README's row whose record it is; records whose commands differ
    in more than the backend, where their files are and the flags that the recipe has made
    its defaults since make no table."""
    command = ("KERAS_BACKEND={} python -m recipes.multi30k --direction de-en --data-dir {} "
               "--run-dir {}")
    made = {"commit": "abc1234", "cores": 2, "cpu": "Intel(R) Xeon(R) Processor",
            "isa": "AVX-512",
            "command": command.format("tensorflow", "d", "r") + " --no-separate-vocabularies"}
    records = {
        "tf.json": {"backend": "tensorflow", "steps": 8000, "train_seconds": 4648.7,
                    "bleu": 42.2945, "bleu_lowercase": 42.5289,
                    "averaged": {"bleu": 42.1408, "bleu_lowercase": 42.375},
                    "alpha_tuning": {"alpha": 1.2, "bleu_lowercase": {"1.0": 42.95, "1.2": 43.06}},
                    "validation_loss": {"1000": 4.2418, "2400": 3.72, "3600": 3.6141,
                                        "8000": 3.4932}, "provenance": made},
        "jax.json": {"backend": "jax", "steps": 8000, "train_seconds": 6001.0, "bleu": 41.5,
                     "bleu_lowercase": 41.75, "averaged": {"bleu": 41.6, "bleu_lowercase": 41.9},
                     "alpha": 0.6, "validation_loss": {"1000": 4.3, "8000": 3.5},
                     "provenance": {
                         **made, "cpu": "AMD EPYC 7B13", "isa": "AVX2", "commit": "def5678",
                         "command": command.format("jax", "e", "s")}}}
    for name, record in records.items():
        (tmp_path / name).write_text(json.dumps(record))
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "headlines.json").write_text(json.dumps(
        {"rows": [{"name": "de-en", "from": "tf.json", "figure": "bleu"}]}))
    spec = {"rows": [{"headline": "de-en"}, {"from": "jax.json"}]}
    (tmp_path / "backends.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="differ in more than the backend: tf.json: "
                                         "`--no-separate-vocabularies`; jax.json: ``"):
        tables.render("backends.json", "backends", str(tmp_path))
    spec["defaults_since"] = ["--no-separate-vocabularies"]
    (tmp_path / "backends.json").write_text(json.dumps(spec))
    lines = tables.render("backends.json", "backends", str(tmp_path)).splitlines()
    assert lines[0] == ("| backend | CPU | code | steps | training time | validation loss at "
                        "1000 / 2400 / 3600 / the last step | test2016 lower-cased: last / "
                        "averaged | cased: last / averaged | α (validation BLEU, lower-cased) |")
    assert lines[2:] == [
        "| TensorFlow | Intel Xeon (AVX-512) | commit `abc1234` | 8000 | 1 h 17 min 29 s "
        "| 4.242 / 3.720 / 3.614 / 3.493 | 42.53 / 42.38 | 42.29 / 42.14 | 1.2 (43.06) |",
        "| JAX | AMD EPYC 7B13 (AVX2) | commit `def5678` | 8000 | 1 h 40 min 1 s "
        "| 4.300 / – / – / 3.500 | 41.75 / 41.90 | 41.50 / 41.60 | 0.6 (given) |"]
    records["jax.json"]["provenance"]["command"] += " --steps 4000"
    (tmp_path / "jax.json").write_text(json.dumps(records["jax.json"]))
    with pytest.raises(ValueError, match="differ in more than the backend: tf.json: ``; "
                                         "jax.json: `--steps 4000`"):
        tables.render("backends.json", "backends", str(tmp_path))


def test_gpu_multi30ks_batches_follow_the_pipelines_bucket_plan():
    """benchmarks/gpu_multi30k.py batches ids in NumPy as the tf.data pipeline plans them:
    each batch one bucket's width and size, sources ending in EOS, the decoder input
    starting with BOS and the labels shifted left by one, over-long and empty pairs never
    drawn, every pass in a new order."""
    from keras_transformer.data.pipeline import bucket_plan

    gpu_multi30k = benchmark_module("gpu_multi30k")
    rng = np.random.default_rng(0)
    lengths = [(int(a), int(b)) for a, b in rng.integers(1, 14, size=(300, 2))]
    lengths += [(20, 3), (3, 16), (0, 4)]  # too long for 16 positions either side, and empty
    rows = {side: [list(rng.integers(4, 50, size=n)) for n in column]
            for side, column in zip(("source", "target"), zip(*lengths))}
    for pair, ids in enumerate(rows["source"]):  # each source starts with its pair's own id
        ids[:1] = [1000 + pair] if ids else []
    data = dict(pad_id=0, bos_id=1, eos_id=2, source_eos_id=3)
    for side, side_rows in rows.items():
        data.update(gpu_multi30k._ragged(f"train_{side}", side_rows))
    _, sizes, widths = bucket_plan(16, 64, 4)
    seen, order = set(), []
    stream = gpu_multi30k.batches(data, 16, 64, 4, seed=1)
    for _ in range(60):
        inputs, labels = next(stream)
        source, target = inputs["source"], inputs["target"]
        bucket = widths.index(source.shape[1])
        assert source.shape == target.shape == labels.shape == (sizes[bucket], widths[bucket])
        for row in range(len(source)):
            ids = [int(i) for i in source[row] if i]
            pair = ids[0] - 1000
            assert ids[:-1] == rows["source"][pair]
            assert ids[-1] == 3 and len(ids) - 1 == lengths[pair][0] < 16
            target_ids = [int(i) for i in target[row] if i]
            assert target_ids == [1, *rows["target"][pair]]
            assert [int(i) for i in labels[row] if i] == [*rows["target"][pair], 2]
            seen.add(pair)
            order.append(pair)
    assert seen <= set(range(300)) and len(seen) > 250
    first_pass, second_pass = order[:250], order[300:550]
    assert first_pass != second_pass  # a new order each pass

    def first_batch(seed):
        return next(gpu_multi30k.batches(data, 16, 64, 4, seed=seed))[0]["source"].tolist()

    assert first_batch(1) == first_batch(1) != first_batch(2)


def test_a_gpu_run_with_its_baseline_makes_the_table_of_before_and_after(tables):
    """gpu_tables.gpu_before_after: the JAX base runs of gpu_all.sh with BEFORE, the baseline
    beside this commit by precision, the run on real ids after, the profile and other
    models left out, and the float16 rows' skipped steps; and gpu_tables.gpu_paper_time, the
    paper's training time at the same runs' rate."""
    def line(run, precision="mixed_bfloat16", ids="zipf 1.1", config="base", step=0.04):
        return {"run": run, "result": dict(
            backend="jax", config=config, precision=precision, ids=ids, steps=40,
            skipped_steps=1, median_step_s=step, tokens_per_s=24896 / step)}

    lines = [line("jax-base-bf16"), line("jax-big-bf16", config="big"),
             line("before-jax-base-bf16", step=0.1), line("jax-base-bf16-profile"),
             line("jax-base-fp16", "mixed_float16"), {"run": "x", "wall_s": 3},
             line("before-jax-base-fp16", "mixed_float16", step=0.1),
             line("jax-base-bf16-real-ids", ids="ids.npy", step=0.032)]
    rows = tables.gpu_tables.gpu_before_after("gpu_before_after", lines).splitlines()[2:]
    assert [row.split(" | ")[0] for row in rows] == [
        "| before (`before-jax-base-bf16`)", "| after (`jax-base-bf16`)",
        "| after, ids of real text (`jax-base-bf16-real-ids`)",
        "| before (`before-jax-base-fp16`)", "| after (`jax-base-fp16`)"]
    assert rows[0].split(" | ")[3:] == ["100.0", "248,960", "– |"]
    assert rows[3].endswith("| 1 of 40 |")
    # wmt14.md's table: the paper's steps at the bf16 JAX runs' rate, the rest left out.
    rows = tables.gpu_tables.gpu_paper_time("gpu_paper_time", lines).splitlines()[2:]
    assert rows == [
        "| base | 100,000 × ~25,000 | 2.5 billion | 622,400 | "
        "2.5e9 / 622,400 = 4,017 s ≈ 1.1 hours |",
        "| big | 300,000 × ~25,000 | 7.5 billion | 622,400 | "
        "7.5e9 / 622,400 = 12,050 s ≈ 3.3 hours |"]


def test_a_streaming_run_makes_translations_table_and_bad_sizes_are_refused(tables, tmp_path):
    """streaming.py's results (docs/translation.md): the medians of start-up, file and pipe,
    the writer's first latency and the range of the others'; sizes below 1 and a missing
    model are refused before any process starts."""
    run = {"command": "python benchmarks/streaming.py runs/quickstart", "commit": "abc1234",
           "backend": "jax", "lines": 300, "repeats": 3, "wait_ms": 50, "start_wait": 20.0,
           "machine": {"usable_cores": 2, "cpu": "AMD EPYC", "isa": "AVX2"},
           "median_seconds": {"start-up": 6.444, "file": 9.613, "pipe": 9.705},
           "writer_latencies": [1.2434, 0.0581, 0.0572, 0.0576]}
    lines = tables.KINDS["streaming"]("streaming", run).splitlines()
    assert lines[0] == ("- `python benchmarks/streaming.py runs/quickstart` at commit `abc1234`, "
                        "on 2 cores of AMD EPYC (AVX2), under JAX; start-up, file and pipe: the "
                        "median of 3 runs each")
    assert [line.rsplit("|", 2)[1].strip() for line in lines[4:]] == [
        "6.44", "9.61", "9.71", "1.243", "0.057 to 0.058"]
    assert "| 300 lines from a pipe that `cat` fills, start-up included |" in lines[6]
    assert "each of its 3 later lines, answered (the 50 ms wait for more lines" in lines[8]
    # A writer that did not wait out the start-up, or sent one line, makes no table.
    with pytest.raises(ValueError, match="may hold the start-up"):
        tables.KINDS["streaming"]("streaming", {**run, "start_wait": 8.0})
    with pytest.raises(ValueError, match="fewer than two lines"):
        tables.KINDS["streaming"]("streaming", {**run, "writer_latencies": [1.0]})
    streaming = benchmark_module("streaming")
    with pytest.raises(ValueError, match="--lines and --repeats must be at least 1"):
        streaming.main([str(tmp_path), "--lines", "0"])
    with pytest.raises(FileNotFoundError, match="no model at"):
        streaming.main([str(tmp_path / "missing")])


def test_a_chunked_loss_run_makes_its_table_and_a_quick_one_is_refused(tables, tmp_path,
                                                                         monkeypatch):
    """chunked_loss.py's results (benchmarks/RESULTS.md), from its own main with each
    child's line given: per backend and vocabulary the median of the rounds, their range,
    the step over the whole logits' and the peak RSS; a --quick run makes no table."""
    chunked_loss = benchmark_module("chunked_loss")
    steps = {("torch", "0"): [410.0, 400.0, 420.0], ("torch", "1024"): [330.0, 350.0, 340.0],
             ("jax", "0"): [500.0, 510.0, 505.0], ("jax", "1024"): [600.0, 590.0, 610.0]}
    calls, real_run = [], subprocess.run  # the module is shared: git's calls go through

    def child(command, env=None, **keywords):
        if "--child" not in command:
            return real_run(command, env=env, **keywords)
        vocab, chunk = command[command.index("--child") + 1].split(",")
        round_ = sum(1 for c in calls if c == (env["KERAS_BACKEND"], chunk))
        calls.append((env["KERAS_BACKEND"], chunk))
        line = json.dumps({"ms_per_step": steps[env["KERAS_BACKEND"], chunk][round_],
                           "peak_rss_mb": 1024.0 + 100 * round_})
        return subprocess.CompletedProcess(command, 0, stdout=f"progress\n{line}\n")

    monkeypatch.setattr(chunked_loss.subprocess, "run", child)
    output = tmp_path / "chunked.json"
    chunked_loss.main(["--backends", "torch,jax", "--vocab-sizes", "8000",
                       "--output", str(output)])
    assert calls[:4] == [("torch", "0"), ("torch", "1024"), ("jax", "0"), ("jax", "1024")]
    run = json.loads(output.read_text())
    lines = tables.KINDS["chunked_loss"]("chunked_loss", run).splitlines()
    assert lines[0].startswith(f"- `{run['command']}` at commit `{run['commit']}`, on ")
    assert "python benchmarks/chunked_loss.py --backends torch,jax " in run["command"]
    assert lines[0].endswith("; one batch of 64 × 32 tokens a side, one process per row and "
                             "round, the median of 3 interleaved rounds")
    assert lines[4:] == [
        "| torch | 8,000 | whole | 410 | 400–420 | 1.00 | 1.10 GiB |",
        "| torch | 8,000 | chunks of 1,024 | 340 | 330–350 | 0.83 | 1.10 GiB |",
        "| JAX | 8,000 | whole | 505 | 500–510 | 1.00 | 1.10 GiB |",
        "| JAX | 8,000 | chunks of 1,024 | 600 | 590–610 | 1.19 | 1.10 GiB |"]
    with pytest.raises(ValueError, match="--quick run's figures are meaningless"):
        tables.KINDS["chunked_loss"]("chunked_loss", {**run, "command": run["command"] +
                                                      " --quick"})


def test_cpu_step_runs_make_one_table_a_column_pair_each(tables, tmp_path, monkeypatch):
    """cpu_step.py's results (benchmarks/RESULTS.md), from its own main with each child's
    line given, one run as the machine is and one under `--max-isa AVX2`'s cap: per
    backend and loss, each run's ms per step (the median of its rounds) and the step over
    TensorFlow's with the same loss in the same run; a --quick run makes no table."""
    cpu_step = benchmark_module("cpu_step")
    steps = {"tensorflow": 400.0, "jax": 520.0, "torch": 460.0}
    real_run = subprocess.run  # the module is shared: git's calls go through

    def child(command, env=None, **keywords):
        if "--child" not in command:
            return real_run(command, env=env, **keywords)
        scale = 1.25 if os.environ.get(cpu_step.common.ISA_CAP_VARIABLE) else 1.0
        windows = [steps[env["KERAS_BACKEND"]] * scale + delta for delta in (-10, 0, 30)]
        line = json.dumps({"ms_per_step": windows[1], "window_ms_per_step": windows})
        return subprocess.CompletedProcess(command, 0, stdout=f"  window 1/3\n{line}\n")

    monkeypatch.setattr(cpu_step.subprocess, "run", child)
    monkeypatch.setattr(cpu_step, "prepare", lambda args, folder: None)
    monkeypatch.delenv("XLA_FLAGS", raising=False)  # the suite's own (tests/conftest.py)
    folder = tmp_path / "cpu-step"
    folder.mkdir()
    arguments = ["--losses", "chunked", "--steps", "40", "--windows", "3", "--rounds", "1"]
    cpu_step.main([*arguments, "--output", str(folder / "1-as-it-is.json")])
    monkeypatch.setenv(cpu_step.common.ISA_CAP_VARIABLE, "AVX2")
    cpu_step.main([*arguments, "--max-isa", "AVX2", "--output", str(folder / "2-capped.json")])
    runs = tables.records.load(str(folder))
    assert runs[0]["rows"][0]["windows"] == [[390.0, 400.0, 430.0]]
    lines = tables.KINDS["cpu_step"]("cpu_step", runs).splitlines()
    machine = tables.records._machine(runs[0]["machine"], False)
    assert lines[0] == (f"- `{runs[0]['command']}` at commit `{runs[0]['commit']}`, on "
                        f"{runs[0]['machine']['usable_cores']} cores of {machine}; the median "
                        "of 3 windows of 40 steps")
    assert cpu_step.rounds_of_windows(2, 3, 40) == ("the median of 2 rounds, each the median of "
                                                   "3 windows of 40 steps")
    assert "python benchmarks/cpu_step.py --losses chunked " in runs[0]["command"]
    assert ", every engine capped at AVX2; " in lines[1] and "--max-isa AVX2" in lines[1]
    assert lines[3] == (f"| backend | loss | {machine}, ms per step | × TensorFlow | "
                        f"{machine}, capped at AVX2, ms per step | × TensorFlow |")
    assert lines[5:] == ["| TensorFlow | chunked | 400 | 1.00 | 500 | 1.00 |",
                         "| JAX | chunked | 520 | 1.30 | 650 | 1.30 |",
                         "| torch | chunked | 460 | 1.15 | 575 | 1.15 |"]
    with pytest.raises(ValueError, match="--quick run's figures are meaningless"):
        tables.KINDS["cpu_step"]("cpu_step", [{**runs[0], "quick": True}])

    # A profiled run, with the XLA_FLAGS its processes ran with in its command: one run (a
    # file, not a folder) makes the table, and its profile a row per backend and loss.
    monkeypatch.delenv(cpu_step.common.ISA_CAP_VARIABLE)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=")
    profile = {"groups_ms": {"matmul": 139.4, "layout": 173.0, "element-wise and other": 413.0},
               "top_ms": {"copy_bitcast_fusion": 129.0, "dot": 139.0, "wrapped_reduce": 118.0,
                          "add": 3.0}}
    real_child = child

    def profiled(command, env=None, **keywords):
        done = real_child(command, env=env, **keywords)
        if "--child" in command:
            line = json.loads(done.stdout.splitlines()[-1])
            done.stdout = json.dumps(dict(line, profile=profile)) + "\n"
        return done

    monkeypatch.setattr(cpu_step.subprocess, "run", profiled)
    cpu_step.main(["--backends", "jax", "--losses", "reference", "--steps", "30", "--windows",
                   "3", "--rounds", "1", "--profile", "--output", str(tmp_path / "ynn.json")])
    run = tables.records.load(str(tmp_path / "ynn.json"))
    assert run["command"].startswith(
        "XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= TF_CPP_MIN_LOG_LEVEL=3 python ")
    lines = tables.KINDS["cpu_step"]("cpu_step", run).splitlines()
    assert lines[-1] == (f"| {machine}, `XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=` | "
                         "JAX, reference | 139 | 0 | 173 | 0 | 413 | `dot` 139, "
                         "`copy_bitcast_fusion` 129, `wrapped_reduce` 118 |")


ECHO = "import sys\nfor line in sys.stdin:\n    print(line.strip()[::-1], flush=True)\n"


def test_the_slow_writer_times_each_answer_and_a_command_that_stops_answering_is_an_error(
        monkeypatch):
    """streaming.py's writer on a stand-in for `translate` (a Python loop that answers each
    line at once): a latency per line, and a command that ends, or says nothing, fails with
    its error output instead of waiting for ever."""
    streaming = benchmark_module("streaming")
    monkeypatch.setattr(streaming, "FIRST_PAUSE", 0.0)
    monkeypatch.setattr(streaming, "LATER_PAUSE", 0.0)
    monkeypatch.setattr(streaming, "translate_command",
                        lambda model: [sys.executable, "-c", model])
    latencies = streaming.writer_latencies(ECHO, start_wait=0)
    assert len(latencies) == len(streaming.WRITER_LINES)
    assert all(0 < seconds < 5 for seconds in latencies)
    ends = "import sys\nsys.stderr.write('model not found')\nsys.exit(3)"
    with pytest.raises(RuntimeError, match=r"did not answer 'kave tomi tozu'.*model not found"):
        streaming.writer_latencies(ends, start_wait=0.5)
    silent = "import sys, time\nsys.stdin.readline()\ntime.sleep(30)"
    with pytest.raises(RuntimeError, match="did not answer 'kave tomi tozu'"):
        streaming.writer_latencies(silent, start_wait=0, timeout=1)


def test_cluster_faults_records_each_kill_and_makes_a_row_per_backend_and_process(
        tables, tmp_path, monkeypatch):
    """cluster_faults.py's results (docs/distributed.md), from its own main with each
    cluster's outcome given: a row per backend and process killed, in the order 1 then
    0, its kills' seconds to the survivor's exit and line, its statuses (a signal's
    named) and the first sentence of its distinct lines, addresses left out; the line is
    the survivor's `error:` line, else a native fatal line's message, else its last."""
    cluster_faults = benchmark_module("cluster_faults")
    assert cluster_faults.reason("a\nerror: Lost worker 1 of TF_CONFIG\nbye\n") == (
        "error: Lost worker 1 of TF_CONFIG")
    assert cluster_faults.reason("Step 4\n  Failed to send RPC  \n\n") == "Failed to send RPC"
    assert cluster_faults.reason(
        "Epoch 1\nF1206 02:25:05.302430   23069 client.h:80] Terminating process because the "
        "JAX distributed service detected fatal errors.\n*** Check failure stack trace: ***\n"
        "    @     0x7fcdc9ea71f5  (unknown)\n") == (
        "Terminating process because the JAX distributed service detected fatal errors.")
    outcomes = {("jax", 1): (36.31, -6, "error: Lost a process ([127.0.0.1]:24473). Start "
                             "every process again with `the same command`."),
                ("jax", 0): (0.12, 1, "RPC"),
                ("tensorflow", 1): (8.04, 1, "error: Lost worker 1"),
                ("tensorflow", 0): (2.0, 1, "error: Lost worker 0")}
    calls = []

    def kill_one(backend, victim, run_dir, checkpoint_every):
        calls.append((backend, victim, checkpoint_every))
        seconds, status, line = outcomes[backend, victim]
        return {"killed": victim, "seconds": seconds, "status": status, "line": line,
                "line_seconds": None if line == "RPC" else 0.25}

    monkeypatch.setattr(cluster_faults, "kill_one", kill_one)
    output = tmp_path / "cluster-faults.json"
    cluster_faults.main(["--repeats", "2", "--work-dir", str(tmp_path / "runs"),
                         "--output", str(output)])
    assert calls == [(backend, victim, 4) for backend in ("jax", "tensorflow")
                     for victim in (1, 1, 0, 0)]
    result = tables.records.load(str(output))
    lines = tables.KINDS["cluster_faults"]("cluster_faults", result).splitlines()
    assert result["command"] == ("python benchmarks/cluster_faults.py --repeats 2 --work-dir "
                                 f"{tmp_path / 'runs'} --output {output}")
    assert lines[0].startswith(f"`{result['command']}` at commit `{result['commit']}`, on ")
    assert "a backup every 4 steps" in lines[0]
    assert lines[4:] == [
        "| JAX | 1 (a worker) | 36.3 s, 36.3 s | 0.2 s, 0.2 s | SIGABRT (134) | "
        "`error: Lost a process ([ADDRESS]).` |",
        "| JAX | 0 (the chief) | 0.1 s, 0.1 s | –, – | 1 | `RPC` |",
        "| TensorFlow | 1 (a worker) | 8.0 s, 8.0 s | 0.2 s, 0.2 s | 1 | `error: Lost worker 1` |",
        "| TensorFlow | 0 (the chief) | 2.0 s, 2.0 s | 0.2 s, 0.2 s | 1 | `error: Lost worker 0` |"]
    with pytest.raises(SystemExit, match="--repeats"):
        cluster_faults.main(["--repeats", "0"])
    # A real survivor: its line's time and its exit's, its status and its line.
    log = tmp_path / "survivor.log"
    with open(log, "w") as output:
        survivor = subprocess.Popen(
            [sys.executable, "-c", "import sys, time; print('Epoch 1', flush=True); "
             "time.sleep(0.5); print('error: Lost worker 1', flush=True); time.sleep(0.5); "
             "sys.exit(1)"], stdout=output)
        ended = cluster_faults.survivor_ends(survivor, str(log))
    assert (ended["status"], ended["line"]) == (1, "error: Lost worker 1")
    assert 0.4 < ended["line_seconds"] < ended["seconds"]


def test_the_lowest_versions_record_makes_one_line(tables):
    """.ci/lowest_versions.py --output (docs/installation.md): the command, commit and
    machine, each backend's result and time, the whole run's, and what it installed."""
    record = {"commit": "abc1234", "command": "python .ci/lowest_versions.py --output x.json",
              "cpu": "AMD EPYC", "isa": "AVX-512", "cores": 2, "python": "3.11.7",
              "installed": {"keras": "3.5.0", "tensorflow": "2.16.1"}, "seconds": 600,
              "backends": [{"backend": "tensorflow", "passed": True, "seconds": 61.2},
                           {"backend": "torch", "passed": False, "seconds": 5}]}
    assert tables.KINDS["lowest_versions"]("lowest_versions", record) == (
        "`python .ci/lowest_versions.py --output x.json` at commit `abc1234`, on 2 cores of an "
        "AMD EPYC (AVX-512), Python 3.11.7: TensorFlow passed (1 min 1 s), torch FAILED (5 s); "
        "10 min 0 s with the install. Installed: keras 3.5.0, tensorflow 2.16.1.")


def test_isa_check_findings_make_a_row_per_engine(tables):
    """isa_check.py --output (benchmarks/RESULTS.md): the command, commit and machine,
    then each engine, named as the tables name it, as the machine is and capped."""
    result = {"command": "python benchmarks/isa_check.py --output x.json", "commit": "abc1234",
              "machine": {"cpu": "AMD EPYC", "isa": "AVX-512", "usable_cores": 2},
              "engines": {"torch": {"as the machine is": "AVX512", "capped at AVX2": "AVX2"},
                          "CTranslate2": {"as the machine is": "AVX2",
                                          "capped at AVX2": "AVX2"}}}
    assert tables.KINDS["isa_check"]("isa_check", result).splitlines() == [
        "`python benchmarks/isa_check.py --output x.json` at commit `abc1234`, on 2 cores of "
        "an AMD EPYC (AVX-512):", "",
        "| engine | as the machine is | capped at AVX2 |", "| --- | --- | --- |",
        "| PyTorch's ATen kernels | AVX512 | AVX2 |", "| CTranslate2 (its log) | AVX2 | AVX2 |"]
    # The decoding runs beside it, as the machine is and capped, are told apart by the cap.
    assert [tables._run_name({"backend": "jax", "machine": {"isa_cap": cap}})
            for cap in (None, "AVX2")] == ["JAX", "JAX capped at AVX2"]


def test_torch_overhead_runs_make_a_row_per_run_and_model_and_a_profile_table(tables):
    """torch_overhead.py --output, a folder of runs (benchmarks/RESULTS.md): a line per run,
    a row per run and model with the ratios to that run's own peer and Keras model (the
    whole-logits run's name says so), then the profiled run's split, largest area first."""
    machine = {"cpu": "AMD EPYC", "isa": "AVX-512", "usable_cores": 2}
    runs = [{"command": "python benchmarks/torch_overhead.py --profile", "commit": "abc1234",
             "machine": machine, "steps": 30, "rounds": 2, "loss_chunk_size": 1024,
             # A results file's keys are sorted: the rows follow the script's order.
             "rows": {"keras": {"ms_per_step": 20.0, "round_ms_per_step": [20.0, 21.0]},
                      "ours": {"ms_per_step": 15.0, "round_ms_per_step": [15.0, 14.0]},
                      "peer": {"ms_per_step": 10.0, "round_ms_per_step": [10.0, 11.0]}},
             "profiles": {"keras": {"optimizer": 2.0, "torch kernels": 3.0},
                          "ours": {"optimizer": 1.0, "layer __call__ machinery": 4.0}}},
            {"command": "python benchmarks/torch_overhead.py --models peer,ours "
                        "--loss-chunk-size 0", "commit": "abc1234", "machine": machine,
             "steps": 30, "rounds": 1, "loss_chunk_size": 0, "profiles": {},
             "rows": {"peer": {"ms_per_step": 8.0, "round_ms_per_step": [8.0]},
                      "ours": {"ms_per_step": 12.0, "round_ms_per_step": [12.0]}}}]
    lines = tables.KINDS["torch_overhead"]("torch_overhead", runs).splitlines()
    assert lines[:2] == [
        "- `python benchmarks/torch_overhead.py --profile` at commit `abc1234`, on 2 cores of "
        "an AMD EPYC (AVX-512): the median of 2 rounds' medians of 30 steps",
        "- `python benchmarks/torch_overhead.py --models peer,ours --loss-chunk-size 0` at "
        "commit `abc1234`, on 2 cores of an AMD EPYC (AVX-512): one round's median of 30 "
        "steps"]
    assert lines[5:10] == [
        "| `torch.nn.Transformer`, eager (the peer) | 10.0 | 10.0, 11.0 | 1.00 | 0.50 |",
        "| ours | 15.0 | 15.0, 14.0 | 1.50 | 0.75 |",
        "| the same shapes from Keras's layers | 20.0 | 20.0, 21.0 | 2.00 | 1.00 |",
        "| `torch.nn.Transformer`, eager (the peer) | 8.0 | 8.0 | 1.00 | — |",
        "| ours, the loss on the whole logits (`--loss-chunk-size 0`) | 12.0 | 12.0 | 1.50 | — |"]
    assert lines[-6:] == ["| where | ours | the same shapes from Keras's layers |",
                          "| --- | --- | --- |", "| layer `__call__` machinery | 4.0 | 0.0 |",
                          "| torch kernels | 0.0 | 3.0 |", "| optimizer | 1.0 | 2.0 |",
                          "| total | 5.0 | 5.0 |"]
    with pytest.raises(ValueError, match="meaningless"):
        tables.KINDS["torch_overhead"]("torch_overhead", dict(runs[1], command="x --quick"))


def test_torch_decoding_results_make_a_row_per_search(tables):
    """torch_decoding.py --output (benchmarks/RESULTS.md): the command, commit, machine and
    sizes, then each search's traced and eager step and their ratio."""
    result = {"command": "python benchmarks/torch_decoding.py --output x.json",
              "commit": "abc1234", "batch": 8, "length": 32,
              "machine": {"cpu": "AMD EPYC", "isa": "AVX-512", "usable_cores": 2},
              "searches": {"greedy": {"traced_ms_per_step": 4.0, "eager_ms_per_step": 20.0},
                           "beam 4": {"traced_ms_per_step": 8.0, "eager_ms_per_step": 26.0}}}
    assert tables.KINDS["torch_decoding"]("torch_decoding", result).splitlines() == [
        "`python benchmarks/torch_decoding.py --output x.json` at commit `abc1234`, on 2 cores "
        "of an AMD EPYC (AVX-512): batch 8, 32 tokens a sentence, the median of 5 calls:", "",
        "| search | traced, ms per step | eager (`torch.no_grad`), ms per step | eager / traced |",
        "| --- | --- | --- | --- |", "| greedy | 4.00 | 20.00 | 5.0× |",
        "| beam 4 | 8.00 | 26.00 | 3.2× |"]


def test_step_by_checkout_runs_make_a_column_per_checkout_and_a_figure_per_process(tables):
    """step_by_checkout.py --output, a folder of runs (benchmarks/RESULTS.md): a line per
    run, a row per backend, a column per checkout's commit in the order met, a checkout
    measured again (in the same run or another) giving its figures side by side."""
    machine = {"cpu": "AMD EPYC", "isa": "AVX-512", "usable_cores": 2}
    runs = [{"command": "python benchmarks/step_by_checkout.py /tmp/before /tmp/after",
             "commit": "abc1234", "machine": machine, "steps": 20,
             "rows": [{"backend": "tensorflow", "checkout": "4b8b2c2", "ms_per_step": 355.04},
                      {"backend": "tensorflow", "checkout": "27d7b75", "ms_per_step": 350.4},
                      {"backend": "torch", "checkout": "4b8b2c2", "ms_per_step": 508.3},
                      {"backend": "torch", "checkout": "27d7b75", "ms_per_step": 522.3}]},
            {"command": "python benchmarks/step_by_checkout.py /tmp/before /tmp/after "
                        "--backends torch --steps 30", "commit": "abc1234", "machine": machine,
             "steps": 30, "rows": [{"backend": "torch", "checkout": "4b8b2c2",
                                    "ms_per_step": 524.3}]}]
    assert tables.KINDS["step_by_checkout"]("step_by_checkout", runs).splitlines() == [
        "- `python benchmarks/step_by_checkout.py /tmp/before /tmp/after` at commit `abc1234`, "
        "on 2 cores of an AMD EPYC (AVX-512): the median of 20 steps a process",
        "- `python benchmarks/step_by_checkout.py /tmp/before /tmp/after --backends torch "
        "--steps 30` at commit `abc1234`, on 2 cores of an AMD EPYC (AVX-512): the median of "
        "30 steps a process", "",
        "| backend | `4b8b2c2`, ms per step | `27d7b75`, ms per step |", "| --- | --- | --- |",
        "| TensorFlow | 355.0 | 350.4 |", "| torch | 508.3; 524.3 | 522.3 |"]


def test_a_recipe_commands_windows_on_each_backend_make_a_row_each(tables, tmp_path):
    """--record keeps each window's seconds, compilation and validation pass from the run's
    training_log.csv; the kind recipe_windows (docs/performance.md) makes a row per backend's
    record: the first two windows with their compilation, and a step of the second without
    its compilation and validation pass; runs whose windows differ in size make no table."""
    folder = tmp_path / "windows"
    folder.mkdir()
    for index, (backend, compiled) in enumerate((("tensorflow", 110.0), ("jax", 48.0)), 1):
        run_dir = tmp_path / backend
        run_dir.mkdir()
        (run_dir / "results.json").write_text(json.dumps({"backend": backend, "provenance": {
            "command": f"KERAS_BACKEND={backend} python -m recipes.multi30k --steps 400",
            "commit": "abc1234", "cores": 2, "cpu": "AMD EPYC", "isa": "AVX-512"}}))
        (run_dir / "training_log.csv").write_text(
            "epoch,compile_seconds,loss,seconds,step,val_loss,validation_seconds\n"
            f"0,{compiled},5.0,231.0,200,4.5,6.0\n1,11.0,4.0,90.0,400,4.0,2.0\n")
        tables.record(str(run_dir), str(folder / f"{index}-{backend}.json"), backend)
    runs = tables.records.load(str(folder))
    assert runs[0]["window_seconds"] == {"200": 231.0, "400": 90.0}
    assert runs[0]["validation_seconds"]["400"] == 2.0 and runs[0]["training_loss"]["400"] == 4.0
    assert tables.KINDS["recipe_windows"]("recipe_windows", runs).splitlines() == [
        "| backend | CPU | code | first window of 200 steps (its compilation) | second window "
        "of 200 (its compilation) | a step of the second window, compilation and validation "
        "left out |", "| --- | --- | --- | --- | --- | --- |",
        "| TensorFlow | AMD EPYC (AVX-512) | commit `abc1234` | 231.0 s (110.0 s) | 90.0 s "
        "(11.0 s) | 0.39 s |",
        "| JAX | AMD EPYC (AVX-512) | commit `abc1234` | 231.0 s (48.0 s) | 90.0 s (11.0 s) | "
        "0.39 s |"]
    shorter = dict(runs[1], **{name: {"100": 1.0, "400": 2.0} for name in (
        "window_seconds", "compile_seconds", "validation_seconds")})
    with pytest.raises(ValueError, match="differ in size"):
        tables.KINDS["recipe_windows"]("recipe_windows", [runs[0], shorter])


def test_engines_runs_make_a_row_per_engine_and_server(tables):
    """engines.py --output, a folder of runs (benchmarks/RESULTS.md): a line per run, then
    a row per model and engine; with --baseline a server column, each engine against the
    SavedModel behind its own server and against itself behind the baseline's."""
    def row(engine, rates, server=None, bleu=None):
        return {"model": "quickstart", "engine": engine, "available_s": 4.26, "server": server,
                "load": [{"clients": c, "sentences_per_s": r, "failed_all_rounds": 0,
                          "p99_ms": 250.4} for c, r in zip((1, 8, 32, 64), rates)],
                **({"bleu": {"cased": 33.961, "lowercase": 34.17}} if bleu else {})}

    machine = {"cpu": "AMD EPYC", "isa": "AVX-512", "usable_cores": 2}
    plain = {"command": "TF_CPP_MIN_LOG_LEVEL=3 python benchmarks/engines.py", "commit": "abc1234",
             "machine": machine, "rows": [row("SavedModel", (200, 600, 800, 810), bleu=True),
                                          row("CTranslate2 int8", (600, 1300, 1800, 1700))]}
    baseline = dict(plain, command="x --baseline /tmp/base", baseline="cc80bde",
                    rows=[row("SavedModel", (200, 600, 800, 810)),
                          row("SavedModel", (100, 300, 400, 410), server="cc80bde")])
    lines = tables.KINDS["engines"]("engines", [plain, baseline]).splitlines()
    assert lines[:5] == [
        "`TF_CPP_MIN_LOG_LEVEL=3 python benchmarks/engines.py` at commit `abc1234`, on 2 cores "
        "of an AMD EPYC (AVX-512); sentences/s:", "",
        "| model | engine | 1 client | 8 clients | 32 clients | 64 clients | × SavedModel at 32 "
        "| failed at 64 | p99 ms at 64 | AVAILABLE after | BLEU cased / lower-cased |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        "| quickstart | SavedModel | 200 | 600 | 800 | 810 | 1.00 | 0 | 250 | 4.3 s "
        "| 33.96 / 34.17 |"]
    assert lines[5] == ("| quickstart | CTranslate2 int8 | 600 | 1,300 | 1,800 | 1,700 | 2.25 "
                        "| 0 | 250 | 4.3 s | — |")
    assert lines[7].endswith("each export also behind the server of commit `cc80bde`; "
                             "sentences/s:")
    assert "| server |" in lines[9] and "| × `cc80bde` at 32 |" in lines[9]
    assert lines[11].startswith("| quickstart | SavedModel | `abc1234` | 200 |")
    assert "| 1.00 | 2.00 |" in lines[11]  # against the baseline's SavedModel: 800 / 400
    assert lines[12].startswith("| quickstart | SavedModel | `cc80bde` | 100 |")
    with pytest.raises(ValueError, match="meaningless"):
        tables.KINDS["engines"]("engines", dict(plain, quick=True))
