"""The figures in the prose of README.md and docs/, and where each one comes from.

A figure is a number written with decimals or thousands separators, or followed by a unit
(`FIGURE`). Outside code, generated blocks, HTML comments, tables marked `<!-- not measured
-->`, inline code and link targets, each figure of a paragraph (or of a row of a table
written by hand) must be found in a source the paragraph has:

- a generated block of its own page (`benchmarks/tables.py` writes them), as written, or a
  number of the results file that block is made from, rounded as the figure is written (a
  whole number below 1,000, which a large results file holds by chance, only from a number
  written in the block: "241 ms" for a cell's 241.3);
- the same of a page that a link in the paragraph's section (from one heading to the next)
  leads to, within the linked section when the link names one (`RESULTS.md#the-multi30k-step-...`),
  or a number of a results file or folder that such a link leads to (under docs/results/,
  benchmarks/results/ or benchmarks/gpu_runs/);
- the difference or the ratio of two such figures of its paragraph, rounded as it is
  written ("42.10, 0.61 above the defaults' 41.49");
- a line of tests/figures_declared.txt (`declared`), which says what the figure is when
  it is not a measurement of ours (a setting, a version, the paper's, a goal, a size) or
  how it follows from measured ones (a difference, a ratio, a range over a table).

tests/test_figures.py fails on a figure with none of these, and on a declaration that no
page's prose holds any more. The check is as strong as a figure is precise: 41.05 or 1.36× is
found in a results file only if it is there, while a small whole number ("27 s", "3×") may
still equal a number written in a large table by chance. Plain Python: no Keras, no pytest.
"""

import glob
import json
import os
import re

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECLARED_FILE = os.path.join(REPOSITORY, "tests", "figures_declared.txt")
# The pages a script writes whole (tests/claims.py, keras_transformer_app.reference).
GENERATED_PAGES = ("docs/claims.md", "docs/commands.md")
# No kind for a measurement: a measured figure comes from a results file, or is not written.
KINDS = ("setting", "version", "paper", "goal", "size", "derived", "example")

_UNITS = (r"%|×|ms\b|µs\b|s\b|min\b|minutes\b|h\b|hours?\b|GiB\b|MiB\b|GB\b|MB\b|BLEU\b|"
          r"sentences/s\b|tokens/s\b|tok/s\b|parameters\b")
FIGURE = re.compile(r"(?<![\w.\-/#^~§:])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+)(?![\w.,]\d)"
                    r"(?:\s?(" + _UNITS + r"))?")
_NUMBER = re.compile(r"(?<![\d.,])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+)(?![\d])")
_BLOCK = re.compile(r"<!-- generated from (\S+) \(")
# Where results files are kept: a link into one of these folders is a source.
_RESULTS = re.compile(r"^(docs/results|benchmarks/results|benchmarks/gpu_runs)/")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")
# What is not prose: inline code, link targets, comments, versions and dotted addresses.
_NOT_PROSE = (re.compile(r"`[^`]*`"), re.compile(r"\]\([^)]*\)"), re.compile(r"<!--.*?-->"),
              re.compile(r"\b\d+(?:\.\d+){2,}\b"), re.compile(r"\bcommit\s+\w+"))


def pages(root=REPOSITORY):
    docs = sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md")))
    return ["README.md", *[p for p in docs if p not in GENERATED_PAGES]]


def anchor(heading):
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as
    hyphens (tests/test_docs.py's links use it too)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _read(page, root):
    with open(os.path.join(root, page), encoding="utf-8") as file:
        return file.read().splitlines()


class Page:
    """A page's generated blocks ((first line, last line, results path, text)), its
    headings ((line, level, anchor)) and its lines."""

    def __init__(self, page, root=REPOSITORY):
        self.name, self.root, self.lines = page, root, _read(page, root)
        self.blocks, self.headings = [], []
        start, fenced = None, False
        for number, line in enumerate(self.lines):
            fenced = fenced != line.startswith("```")
            if fenced:
                continue
            if start is None and (match := _BLOCK.match(line)):
                start, source = number, match.group(1)
            elif start is not None and line.startswith("<!-- end"):
                self.blocks.append((start, number, source, "\n".join(self.lines[start:number])))
                start = None
            elif start is None and (match := _HEADING.match(line)):
                self.headings.append((number, len(match.group(1)), anchor(match.group(2))))

    def section(self, name):
        """(first line, end line) of the section a #anchor names, or the whole page."""
        for index, (line, level, slug) in enumerate(self.headings):
            if slug == name:
                end = next((other for other, other_level, _ in self.headings[index + 1:]
                            if other_level <= level), len(self.lines))
                return line, end
        return 0, len(self.lines)

    def sources(self, section=None):
        """(the numbers written in the generated blocks, the numbers of their results
        files) within the section (an anchor) or the whole page."""
        first, end = self.section(section) if section else (0, len(self.lines))
        written, values = set(), []
        for start, _, source, text in self.blocks:
            if first <= start < end:
                written |= {number.replace(",", "") for number in _NUMBER.findall(text)}
                values += results_numbers(os.path.join(self.root, source), self.root)
        return written, values


def _numbers(value):
    """The numbers of a parsed JSON value, and its keys that are numbers (a step, an α),
    as floats; the strings that name a .json file, as they are."""
    if isinstance(value, dict):
        for key, item in value.items():
            if re.fullmatch(r"\d+(?:\.\d+)?", key):
                yield float(key)
            yield from _numbers(item)
    elif isinstance(value, list):
        for item in value:
            yield from _numbers(item)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield float(value)
    elif isinstance(value, str) and value.endswith(".json"):
        yield value


def results_numbers(path, root=REPOSITORY):
    """Every number of a results file (or of the files of a results folder), keys too,
    and of the results files it names (a table's rows can name their runs' records)."""
    files = [path] if os.path.isfile(path) else sorted(
        glob.glob(os.path.join(path, "**", "*.json"), recursive=True)
        + glob.glob(os.path.join(path, "**", "*.jsonl"), recursive=True))
    found = []
    for name in files:  # grows as files name others
        with open(name, encoding="utf-8") as file:
            values = ([json.loads(line) for line in file if line.strip()]
                      if name.endswith(".jsonl") else [json.load(file)])
        for number in _numbers(values):
            named = os.path.join(root, number) if isinstance(number, str) else None
            if named is None:
                found.append(number)
            elif os.path.isfile(named) and named not in files:
                files.append(named)
    return found


def _prose_lines(lines):
    """(number from 1, the line stripped) of each line of prose or of a table written by
    hand; (number, None) where a paragraph ends without a line of its own (code, a
    generated block, a comment, a table marked not measured)."""
    fenced = generated = comment = not_measured = False
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        fenced = fenced != stripped.startswith("```")
        generated = (generated or bool(_BLOCK.match(stripped))) and not (
            generated and stripped.startswith("<!-- end"))
        opens = stripped.startswith("<!--") and "-->" not in stripped
        skipped = comment or opens or fenced or generated or stripped.startswith("```")
        comment = (comment or opens) and "-->" not in stripped
        not_measured = stripped == "<!-- not measured -->" or (
            not_measured and stripped.startswith("|"))
        yield number, None if skipped or not_measured or stripped.startswith("<!--") \
            else line


def paragraphs(lines):
    """(first line number from 1, text) of each paragraph of prose, each list item and
    each row of a table written by hand, outside code, generated blocks and comments."""
    found, current, start = [], [], 0
    for number, line in [*_prose_lines(lines), (len(lines) + 1, None)]:
        stripped = line.strip() if line else ""
        is_row = stripped.startswith("|")
        if not stripped or _HEADING.match(line) or _LIST_ITEM.match(line) or is_row:
            if current:
                found.append((start, " ".join(current)))
            current = []
        if stripped and not _HEADING.match(line):
            start = number if not current else start
            current.append(stripped)
            if is_row:
                found.append((start, stripped))
                current = []
    return found


def figures(text):
    """The figures of a paragraph's prose, each as written: the number, and its unit
    after a space when it has one ("1.36×", "197 ms", "41.05")."""
    for pattern in _NOT_PROSE:
        text = pattern.sub(" ", text)
    found = []
    for match in FIGURE.finditer(text):
        number, unit = match.groups()
        if unit or "." in number or "," in number:
            found.append(number + (("" if unit in ("%", "×") else " ") + unit if unit else ""))
    return found


# What a results file's number may be multiplied by to be written with the unit: a
# fraction as a percentage, seconds as ms, bytes as GiB, MiB, GB or MB.
_SCALES = {"%": (1, 100), "ms": (1, 1000), "GiB": (1, 2 ** -30), "MiB": (1, 2 ** -20),
           "GB": (1, 1e-9), "MB": (1, 1e-6)}


def _parts(figure):
    """(the number without thousands separators, its decimals, its unit) of a figure as
    `figures` writes it ("1,015.7 sentences/s", "1.36×")."""
    number, _, unit = figure.replace("×", " ×").replace("%", " %").partition(" ")
    plain = number.replace(",", "")
    return plain, len(plain.partition(".")[2]), unit


def _matches(figure, written, values):
    plain, decimals, unit = _parts(figure)
    if plain in written:
        return True
    if not decimals and "," not in figure:
        # A whole number below 1,000 (written without separators) equals some number of a
        # large results file by chance: it must be written in a block, rounded as it is
        # written ("241 ms" for 241.3).
        values = [float(number) for number in written]
    return any(format(value * scale, f".{decimals}f") == plain
               for value in values for scale in _SCALES.get(unit, (1,)))


def _derived(figure, sourced):
    """Whether the figure is the difference or the ratio of two sourced figures of its
    paragraph, rounded as it is written ("0.61 above the defaults' 41.49" after 42.10)."""
    plain, decimals, _ = _parts(figure)
    values = [float(_parts(other)[0]) for other in sourced]
    return any(format(result, f".{decimals}f") == plain
               for a in values for b in values if a != b
               for result in (a - b, a / b if b else 0.0))


def declared(path=DECLARED_FILE):
    """{(page, figure): (kind, reason)} of the declarations file: one per line,
    `PAGE | FIGURE | KIND: what it is`; blank lines and # comments skipped."""
    found = {}
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if not line.strip() or line.startswith("#"):
                continue
            page, figure, reason = (part.strip() for part in line.split("|", 2))
            kind = reason.partition(":")[0]
            if kind not in KINDS or not reason.partition(":")[2].strip():
                raise ValueError(f"{path}:{number}: say `KIND: what it is`, KIND one of {KINDS}")
            found[(page, figure)] = (kind, reason)
    return found


def _sections(page):
    """(after this line, up to and including this line), counted from 1, of each part of
    the page between two headings (any level)."""
    bounds = [0, *[line + 1 for line, _, _ in page.headings], len(page.lines) + 1]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(len(bounds) - 1)]


def unsourced(root=REPOSITORY):
    """[(page, line, figure)] of every figure no source of its paragraph holds."""
    loaded, missing = {}, []

    def page_of(name):
        if name not in loaded:
            loaded[name] = Page(name, root)
        return loaded[name]

    for name in pages(root):
        page = page_of(name)
        own = page.sources()
        found = paragraphs(page.lines)
        for first, end in _sections(page):
            here = [(line, text) for line, text in found if first < line <= end]
            candidates = [own]
            for target in {t for _, text in here for t in _LINK.findall(text)}:
                path, _, section = target.partition("#")
                linked = os.path.normpath(os.path.join(os.path.dirname(name), path))
                if re.match(r"[a-z]+:", target) or not os.path.exists(os.path.join(root, linked)):
                    continue
                if path.endswith(".md"):
                    candidates.append(page_of(linked).sources(section or None))
                elif _RESULTS.search(linked):  # a results file, or a file beside them
                    folder = os.path.join(root, linked)
                    folder = folder if os.path.isdir(folder) or folder.endswith(
                        (".json", ".jsonl")) else os.path.dirname(folder)
                    candidates.append((set(), results_numbers(folder, root)))
            for line, text in here:
                written = figures(text)
                sourced = [figure for figure in written if any(
                    _matches(figure, *candidate) for candidate in candidates)]
                missing += [(name, line, figure) for figure in written
                            if figure not in sourced and not _derived(figure, sourced)]
    return missing
