"""The command reference, docs/commands.md, written from the verbs' own parsers (built from their option dataclasses):
the page is what `--help` prints, so it cannot drift from it. tests/test_docs.py compares the committed page with
this output; `python -m hitoban.verbs.reference > docs/commands.md` writes it again."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator

from hitoban.errors import EXIT_MEANINGS

WIDTH = 110  # the help's line width on the page, whatever the terminal that wrote it


def verbs(parser: argparse.ArgumentParser, prefix: str = "hitoban") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(the command as typed, its parser) for every verb, nested ones (`eval bpc`) included, in the CLI's order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", sub
                yield from verbs(sub, f"{prefix} {name}")


def command_reference() -> str:
    """The whole page: the verbs in the order a night goes, each with its `--help`, then the exit codes."""
    from hitoban.cli import PIPELINE, build_parser

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)  # argparse wraps at the terminal's width
    try:
        parser = build_parser()
        helps = [(command, sub.format_help()) for command, sub in verbs(parser)]
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    groups = {name: group for group, names in PIPELINE.items() for name in names}
    lines = ["# Command reference", "",
             "Generated from the verbs' own option declarations by `python -m hitoban.verbs.reference > "
             "docs/commands.md` (a test compares this page with that output): each block is what `hitoban VERB "
             "--help` prints. Options are checked where they are declared, before anything is read or written; a "
             "bad value, a missing or undecodable file, an output that would overwrite something is one line naming "
             "the option or the file.", ""]
    group = None
    for command, text in helps:
        top = command.split()[1]
        if groups[top] != group and command.count(" ") == 1:
            group = groups[top]
            lines += [f"## {group}", ""]
        lines += [f"### `{command}`", "", "<!-- test: reference -->", "```text", text.rstrip(), "```", ""]
    lines += ["## Exit codes", "", "Scripts can tell these apart (`hitoban/errors.py`):", "", "| exit | meaning |",
              "|---:|---|"]
    lines += [f"| {int(code)} | {meaning} |" for code, meaning in EXIT_MEANINGS.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(command_reference())
