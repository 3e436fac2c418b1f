"""The command reference, `docs/commands.md`, generated from the parsers (no paper section).

Every command of `keras-transformer` and every recipe (`python -m recipes.NAME`), with each
argument and option: its flags, its default and its help, as the parsers hold them. Run from
the checkout's root (the recipes are not installed with the package):

    python -m keras_transformer_app.reference > docs/commands.md

`tests/test_docs.py` fails when the page and the parsers disagree.
"""

import argparse
import importlib
import sys

from keras_transformer_app import compat

#: The recipes with a parser of their own (`recipes.average` is `keras-transformer average`).
RECIPES = ("quickstart", "multi30k", "anki", "wmt14", "table3")

HEADER = """# Command reference

Generated from the parsers by `python -m keras_transformer_app.reference > docs/commands.md`;
`tests/test_docs.py` fails when this page and the parsers disagree. Every command takes
`--help`, which prints the same with the command's description. Recipes run from the
checkout's root (`recipes/` is not installed with the package).
"""


def parsers():
    """`[(command line, parser)]`: `keras-transformer`'s commands, then the recipes'."""
    from keras_transformer_app.cli import parser as cli_parser

    found = []

    def walk(name, parser):
        found.append((name, parser))
        for action, subparsers in compat.parser_actions(parser):
            for command, subparser in (subparsers or {}).items():
                walk(f"{name} {command}", subparser)

    walk("keras-transformer", cli_parser.build_parser())
    for recipe in RECIPES:
        module = importlib.import_module(f"recipes.{recipe}")
        found.append((f"python -m recipes.{recipe}", module.build_parser()))
    return found


def _cell(text):
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(action):
    if action.default in (None, argparse.SUPPRESS):
        return ""
    if action.default is False and action.nargs == 0:
        return ""  # a switch, off unless given
    return f"`{action.default}`"


def _help(action):
    text = action.help or ""
    if "%(" in text:
        values = dict(vars(action), prog="")
        values.update(default=action.default, choices=action.choices)
        try:
            text = text % values
        except (KeyError, TypeError, ValueError):
            pass
    if action.choices is not None and not isinstance(action.choices, dict):
        text += f" (one of: {', '.join(map(str, action.choices))})"
    return text


def _names(action):
    name = action.metavar or action.dest.upper()
    if isinstance(name, tuple):
        name = " ".join(name)
    if not action.option_strings:
        return f"`{name}`"
    value = "" if action.nargs == 0 else f" {name}"
    return ", ".join(f"`{flag}{value}`" for flag in action.option_strings)


def section(name, parser):
    """The Markdown of one command: its usage and a table of its arguments."""
    usage = " ".join(parser.format_usage().split())
    if usage.startswith("usage: "):
        usage = usage[len("usage: "):]
    lines = [f"## `{name}`", "", f"    {usage}", ""]
    if parser.description:  # its first paragraph
        lines += [" ".join(parser.description.strip().split("\n\n")[0].split()), ""]
    rows = []
    for action, subparsers in compat.parser_actions(parser):
        if action.help == argparse.SUPPRESS or action.dest == "help":
            continue
        if subparsers is not None:
            commands = ", ".join(f"`{command}`" for command in subparsers)
            rows.append(f"| {_names(action)} | | one of: {commands} (each below) |")
            continue
        rows.append(f"| {_names(action)} | {_cell(_default(action))} | "
                    f"{_cell(_help(action))} |")
    if rows:
        lines += ["<!-- not measured -->", "| argument | default | help |", "| --- | --- | --- |",
                  *rows, ""]
    return lines


def reference():
    """The whole page (str)."""
    lines = [HEADER]
    for name, parser in parsers():
        lines += section(name, parser)
    return "\n".join(lines).rstrip() + "\n"


def main():
    sys.stdout.write(reference())


if __name__ == "__main__":
    main()
