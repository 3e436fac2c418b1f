"""The pages run as a new user runs them: README.md, then docs/ and the benchmarks' pages,
every ```bash block in page order in one fresh copy of the checkout per chain of pages that
build on each other (tests/page_walk.py has the walk, its chains, its substitution tables and
the marker of a block that cannot run here).

The walk is the suite's second tier (marked `walk`): the README's test command leaves it out,
and `python -m pytest -q -n 2 --dist loadgroup --walk tests/test_pages.py` runs it alone,
each chain on one worker (its pages in order, in one clone) and the chains side by side. Its
subject is the program, not a backend (its commands pick their backends, as the pages write
them). The benchmarks' chain is walked by hand (see page_walk.py). The other tests of this
file check the walk itself and run in the torch pass. A failure names the page and the line
of the block that failed, with the table of what the walk changed and the output's end.
"""

import glob
import os
import re

import page_walk
import pytest
from helpers import REPOSITORY, data_mirror, loopback_http


@pytest.mark.once("torch")
def test_every_page_with_shell_blocks_is_walked():
    pages = ["README.md", *glob.glob("docs/*.md", root_dir=REPOSITORY),
             *glob.glob("benchmarks/**/*.md", root_dir=REPOSITORY, recursive=True),
             *glob.glob("saved_models/*.md", root_dir=REPOSITORY)]
    with_blocks = {page for page in pages if page_walk.blocks(page_walk.read(page))}
    assert with_blocks <= set(page_walk.PAGES), sorted(with_blocks - set(page_walk.PAGES))
    assert set(page_walk.SUBSTITUTIONS) <= set(page_walk.PAGES)


# A page's paragraph on what it takes from other pages says "what other pages make first" (or
# "what another page makes first"); the paths of runs and exports the blocks name; where a
# block makes one (a recipe's own run directory, unless the command names another).
_NEEDS_PARAGRAPH = re.compile(r"what (?:other pages make|another page makes) first")
_RUN_PATH = re.compile(r"(?<![\w/.~$-])((?:runs|saved_models|ct2_models)/[\w.-]+)")
_MAKES = re.compile(r"(?:--run-dir|--export-dir) (\S+)|keras-transformer export \S+ (\S+)")
_RECIPE = re.compile(r"python -m recipes\.(\w+)([^\n#|&;]*)")


def _needs_paragraph(page):
    paragraphs = [paragraph for paragraph in page_walk.read(page).split("\n\n")
                  if _NEEDS_PARAGRAPH.search(" ".join(paragraph.split()))]
    assert len(paragraphs) <= 1, f"{page}: more than one paragraph on what other pages make first"
    return " ".join(paragraphs[0].split()) if paragraphs else None


def _run_paths(page):
    """(the run and export paths its blocks name, those its blocks make)"""
    import importlib

    code = "\n".join(code for _, code, _ in page_walk.blocks(page_walk.read(page)))
    # recipes.average reads the run its --run-dir names; it makes no run (its --output, or
    # RUN_DIR/model_averaged.keras by default, is a model file).
    making = "\n".join(line for line in code.splitlines() if "recipes.average" not in line)
    makes = {"".join(found) for found in _MAKES.findall(making)}
    for name, options in _RECIPE.findall(making):
        if "--run-dir" in options:
            continue
        parser = importlib.import_module(f"recipes.{name}").build_parser()
        [text] = [action.help for action in parser._actions if action.dest == "run_dir"]
        run_dir = parser.get_default("run_dir") or re.search(r"default: (\S+)\)", text)[1]
        for word in ("DIRECTION", "CONFIG"):  # runs/multi30k-DIRECTION and the like
            given = re.search(rf"--{word.lower()} (\S+)", options)
            run_dir = run_dir.replace(word, given[1] if given else
                                      str(parser.get_default(word.lower()) or word))
        makes.add(run_dir)
    return set(_RUN_PATH.findall(code)), makes


@pytest.mark.once("torch")
def test_a_page_declares_what_the_walk_makes_for_it_from_another_chain():
    """What the walk makes before a page (page_walk.BEFORE) is what the page says, in the
    paragraph on "what other pages make first", that it takes from other pages."""
    for page, entries in page_walk.BEFORE.items():
        paragraph = _needs_paragraph(page)
        assert paragraph, f"{page}: no paragraph on what other pages make first"
        missing = [makes for _, makes, _ in entries if f"`{makes}`" not in paragraph]
        assert not missing, f"{page} does not say it takes {missing} from other pages"


@pytest.mark.once("torch")
def test_a_page_declares_the_runs_it_takes_from_the_pages_before_it():
    """A run or export that a page's blocks use and do not make is made by a page before it in
    its chain (or by page_walk.BEFORE), and its paragraph on what other pages make first
    names it; a run that paragraph names is made before the page (no stale declaration)."""
    for pages in page_walk.CHAINS.values():
        made_before = set()
        for page in pages:
            used, makes = _run_paths(page)
            made_before |= {path for _, path, _ in page_walk.BEFORE.get(page, ())}
            needed = used - makes
            assert needed <= made_before, (
                f"{page} uses {sorted(needed - made_before)}, which no page before it makes")
            paragraph = _needs_paragraph(page) or ""
            missing = [path for path in sorted(needed) if f"`{path}`" not in paragraph]
            assert not missing, f"{page} does not say it takes {missing} from other pages"
            stale = set(re.findall(f"`{_RUN_PATH.pattern}`", paragraph)) - made_before
            assert not stale, f"{page} says it takes {sorted(stale)}, which no page before makes"
            made_before |= makes


@pytest.mark.once("torch")
@pytest.mark.parametrize("page", page_walk.PAGES)
def test_each_substitution_matches_a_block_the_walk_runs(page):
    page_walk.script(page)  # raises on a substitution that matches nothing


@pytest.mark.once("torch")
def test_marked_blocks_are_left_out_and_substitutions_applied(monkeypatch):
    text = ("Intro.\n\n```bash\nrun --steps 8000\n```\n\n"
            "<!-- not run by the tests: it needs a GPU -->\n```bash\nrun --gpu\n```\n\n"
            "```python\nprint(1)\n```\n")
    assert [(line, reason) for line, _, reason in page_walk.blocks(text)] == [
        (4, None), (9, "it needs a GPU")]
    monkeypatch.setitem(page_walk.SUBSTITUTIONS, "page.md", (
        page_walk.Substitution("--steps 8000", "--steps 2", "steps"),))
    script = page_walk.script("page.md", text)
    assert "run --steps 2" in script and "8000" not in script and "--gpu" not in script
    assert 'echo "## page.md:4 (at $SECONDS s)"' in script
    monkeypatch.setitem(page_walk.SUBSTITUTIONS, "page.md", (
        page_walk.Substitution("--steps 9", "--steps 2", "steps"),))
    with pytest.raises(ValueError, match="'--steps 9' matches no block it runs"):
        page_walk.script("page.md", text)
    monkeypatch.setitem(page_walk.SUBSTITUTIONS, "page.md", (
        page_walk.Substitution("--gpu", "", "no GPU"),))
    with pytest.raises(ValueError, match="matches no block it runs"):  # only in a marked one
        page_walk.script("page.md", text)


@pytest.mark.once("torch")
def test_a_marker_without_a_reason_is_an_error():
    with pytest.raises(ValueError, match="line 1: write the marker as"):
        page_walk.blocks("<!-- not run by the tests -->\n```bash\nls\n```\n")


@pytest.mark.once("torch")
def test_a_failing_block_is_named_with_its_line(tmp_path, monkeypatch):
    text = "```bash\ntrue\n```\n\n```bash\necho before\nfalse\necho after\n```\n"
    monkeypatch.setattr(page_walk, "read", lambda page: text)
    run = page_walk.run_page("page.md", str(tmp_path), dict(os.environ), timeout=60)
    assert run.status == 1 and "before" in run.output and "after" not in run.output
    assert page_walk.failure(run).startswith("page.md:6: the block ended with status 1")


@pytest.fixture(scope="module")
def chains(tmp_path_factory):
    """chain name -> (the chain's fresh checkout, its environment, the pages of it that
    failed), made on first use: each chain has a clone and a HOME of its own, and the chains
    share the loopback mirror."""
    made = {}
    pages = sum(len(page_walk.CHAINS[name]) for name in page_walk.WALKED_IN_THE_SUITE)
    with loopback_http(data_mirror(), lifetime=1800 * pages) as mirror:
        def checkout(name):
            if name not in made:
                directory = tmp_path_factory.mktemp(name)
                checkout, home = directory / "checkout", directory / "home"
                checkout.mkdir()
                home.mkdir()
                page_walk.fresh_checkout(str(checkout))
                made[name] = str(checkout), page_walk.environment(str(home), mirror, name), []
            return made[name]

        yield checkout


@pytest.mark.walk
@pytest.mark.parametrize("page", [pytest.param(page, marks=pytest.mark.xdist_group(name))
                                  for name in page_walk.WALKED_IN_THE_SUITE
                                  for page in page_walk.CHAINS[name]])
@pytest.mark.backs("README.md", "block but performance.md's under `tests/test_pages.py` (the walk, "
                                 "in fresh clones")
def test_the_page_runs(page, chains):
    directory, env, failed = chains(page_walk.chain_of(page))
    if failed:
        pytest.fail(f"{page} builds on {failed[0]}, which failed before it in its chain")
    print(page_walk.table(page))
    run = page_walk.run_page(page, directory, env)
    print(run.output)
    if run.status != 0:
        failed.append(page)
    assert run.status == 0, f"{page_walk.table(page)}\n\n{page_walk.failure(run)}"
