"""The command reference, docs/commands.md, written from the verbs' own parsers (built from their option dataclasses):
the page is what `--help` prints, so it cannot drift from it. tests/test_docs.py compares the committed page with
this output; `python -m hitoban.verbs.reference > docs/commands.md` writes it again."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator

from hitoban.errors import ExitCode

WIDTH = 110  # the help's line width on the page, whatever the terminal that wrote it
EXIT_MEANINGS = {  # what each exit code tells a script (hitoban/errors.py owns the codes)
    ExitCode.OK: "done",
    ExitCode.CHECK_FAILED: "a gate found something: a leak, a PII reproduction, a secret, a failed kill test or "
                           "check, a refused upload",
    ExitCode.BAD_INPUT: "bad input: wrong arguments, an unusable file (named, with its byte offset for undecodable "
                        "text), an output that exists, a resume that does not fit",
    ExitCode.DIVERGED: "the loss or the gradient diverged (NaN/inf); the last good checkpoint is untouched",
    ExitCode.NOT_MEASURED: "not measured: there was nothing to measure (e.g. no contact for the PII probe to try)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


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
