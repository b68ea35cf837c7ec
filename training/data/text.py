"""One reader for every text file a verb is given: a corpus file, a bits/char domain, chat data, holdouts,
questions. A missing file names its path (and the verb that makes it, where one does); an undecodable byte names
the file, its byte offset and the `--encoding` / `--errors` choices, instead of a UnicodeDecodeError traceback.
Standard library only: `hitoban leaks` reads through it without torch."""

from __future__ import annotations

import os
from pathlib import Path

from hitoban.errors import InputError, MissingInputError

ENCODING_HINT = ("pass --encoding ENCODING if the file uses another encoding (e.g. shift_jis, cp932), or --errors "
                 "replace to substitute undecodable bytes")


def decode_error(path: str | os.PathLike, err: UnicodeDecodeError, offset: int = 0, encoding: str = "utf-8",
                 hint: str = ENCODING_HINT) -> InputError:
    """The one-line answer for an undecodable byte at `offset + err.start` of `path`."""
    return InputError(f"{Path(path).name}: not valid {encoding} at byte offset {offset + err.start} ({err.reason}); "
                      f"{hint}")


def require_file(path: str | os.PathLike, what: str, made_by: str | None = None) -> Path:
    """`path`, or a MissingInputError naming it, what it was for, and the verb that makes such a file."""
    path = Path(path)
    if not path.is_file():
        found = "is a folder, not a file" if path.is_dir() else "not found"
        raise MissingInputError(f"{what}: {path} {found}" + (f" ({made_by} makes it)" if made_by else ""))
    return path


def read_text(path: str | os.PathLike, what: str = "input", encoding: str = "utf-8", errors: str = "strict",
              made_by: str | None = None, hint: str = ENCODING_HINT) -> str:
    """The whole file decoded, or one line naming the file and what went wrong."""
    data = require_file(path, what, made_by).read_bytes()
    try:
        return data.decode(encoding, errors=errors)
    except UnicodeDecodeError as err:
        raise decode_error(path, err, 0, encoding, hint) from None
    except LookupError:
        raise InputError(f"--encoding {encoding}: not an encoding Python knows") from None
