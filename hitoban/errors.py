"""User-facing errors and the `hitoban` command's exit codes, in one leaf module every area may import.

A `HitobanError` is something the user can act on (bad input, a refusal, a resume that does not fit, a diverged
run, nothing measured): the CLI prints its message in one line and exits with its code. Anything else is a bug or
an environment failure (CUDA out of memory, a torch internal error) and shows its full traceback.
Each class also derives from the built-in exception it replaces, so `except ValueError` keeps working.
"""

from __future__ import annotations

import unicodedata
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    CHECK_FAILED = 1
    BAD_INPUT = 2  # argparse uses 2 as well
    DIVERGED = 3
    NOT_MEASURED = 4
    INTERRUPTED = 130


EXIT_MEANINGS = {  # what each code tells a script; the command reference (docs/commands.md) prints this table
    ExitCode.OK: "done",
    ExitCode.CHECK_FAILED: "a gate found something: a leak, a PII reproduction, a secret, a failed kill test or "
                           "check, a refused upload",
    ExitCode.BAD_INPUT: "bad input: wrong arguments, an unusable file (named, with its byte offset for undecodable "
                        "text), an output that exists, a resume that does not fit",
    ExitCode.DIVERGED: "the loss or the gradient diverged (NaN/inf); the last good checkpoint is untouched",
    ExitCode.NOT_MEASURED: "not measured: there was nothing to measure (e.g. no contact for the PII probe to try)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


def one_line(text: str) -> str:
    """`text` with its control characters (a newline in a device name, a tab in a path) written as escapes, so a
    message that quotes what the user or the machine gave still prints as one line."""
    return "".join(repr(c)[1:-1] if unicodedata.category(c) == "Cc" else c for c in text)


class HitobanError(Exception):
    """Base of every error the user can act on; `exit_code` is what `hitoban` exits with. Its message is one line
    whatever it quotes: the one place that owns that, rather than each message escaping its own values."""

    exit_code: int = ExitCode.BAD_INPUT

    def __str__(self) -> str:
        return one_line(super().__str__())


class UsageError(HitobanError, ValueError):
    """Arguments that do not fit together (e.g. neither --tokens nor --steps)."""


class InputError(HitobanError, ValueError):
    """Input data that cannot be used: empty, malformed, of the wrong kind."""


class MissingInputError(HitobanError, FileNotFoundError):
    """A path the user gave does not exist."""


class OutputExistsError(HitobanError, FileExistsError):
    """An output folder already exists and would be overwritten."""


class ResourceError(HitobanError, MemoryError):
    """Not enough memory or disk for what was asked; the message says what to lower."""


class CheckpointError(HitobanError, RuntimeError):
    """A checkpoint (or a machine's saved optimizer state) cannot be written or does not fit this run; the message
    says what to do."""


class CheckFailed(HitobanError, RuntimeError):
    """A gate refused: a leak, an exact PII reproduction, a failed control, a refused upload."""

    exit_code = ExitCode.CHECK_FAILED


class NotMeasured(HitobanError, RuntimeError):
    """A measurement found nothing to measure; never to be read as "nothing found"."""

    exit_code = ExitCode.NOT_MEASURED


__all__ = ["ExitCode", "HitobanError", "UsageError", "InputError", "MissingInputError", "OutputExistsError",
           "ResourceError", "CheckpointError", "CheckFailed", "NotMeasured", "one_line"]
