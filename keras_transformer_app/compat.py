"""What the program uses of its dependencies beyond their stable public API, in one place (no
paper section; the library's own such uses are `keras_transformer.compat`).

- `parser_actions`: argparse's `ArgumentParser._actions` and `_SubParsersAction`, to walk the
  options of a parser and its subcommands (flag names in error messages, path checks of the
  command line); argparse has no public listing. Tested with Python 3.11.7
  (`tests/test_compat.py`).

The server stands on asyncio and httptools' public parser API
(`keras_transformer_app.serving.protocol`), with nothing of uvicorn's.
"""

import argparse


def parser_actions(parser):
    """`[(action, subparsers)]` of an `argparse.ArgumentParser`: each of its actions, with
    `{command: parser}` for the action of its subcommands and None for any other."""
    return [(action, action.choices if isinstance(action, argparse._SubParsersAction)
             else None) for action in parser._actions]
