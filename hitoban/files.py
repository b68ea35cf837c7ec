"""One reader for every text file a verb is given: a corpus file, a bits/char domain, chat data, holdouts,
questions, a tokenizer folder's files. A missing file names its path (and the verb that makes it, where one does);
an undecodable byte names the file, its byte offset and the `--encoding` / `--errors` choices, instead of a
UnicodeDecodeError traceback. Standard library only: `hitoban leaks` and `hitoban shards` read through it without
torch."""

from __future__ import annotations

import json
import os
import struct
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
        found = ("is a folder, not a file" if path.is_dir() else "is not a regular file (a FIFO or device?)"
                 if path.exists() else "not found")
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


def read_json(path: str | os.PathLike, what: str, made_by: str | None = None, fields: dict | None = None) -> dict:
    """A JSON object, or one line naming the file and what is wrong with it: the one reader for every JSON artefact
    (a manifest, an index, a heartbeat). `fields`: NAME -> type(s) each record must have, checked here once."""
    text = read_text(path, what, made_by=made_by, hint="the file is damaged; rebuild it"
                     + (f" with {made_by}" if made_by else ""))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{what}: {Path(path).name} is not valid JSON (line {err.lineno} column {err.colno}: "
                         f"{err.msg}); the file is damaged or half-written") from None
    return check_fields(data, fields or {}, f"{what}: {Path(path).name}")


def check_fields(data, fields: dict, where: str) -> dict:
    """`data` when it is a JSON object with every field of `fields` of its type, else one line saying which is not."""
    if not isinstance(data, dict):
        raise InputError(f"{where} holds a JSON {type(data).__name__}, not an object; the file is damaged")
    for name, kind in fields.items():
        value = data.get(name)
        if not isinstance(value, kind) or isinstance(value, bool) and kind in (int, float, (int, float)):
            raise InputError(f"{where}: field {name!r} is {'missing' if name not in data else repr(value)[:40]}, "
                             f"not {_kind_name(kind)}; the file is damaged")
    return data


def _kind_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({int: "an integer", float: "a number", str: "a string", dict: "an object", list: "a list",
                        bool: "true/false", type(None): "null"}.get(k, k.__name__) for k in kinds)


def read_jsonl(path: str | os.PathLike, what: str, fields: dict | None = None) -> tuple[list[dict], str | None]:
    """(every whole record, a note when the file ends in a half-written line): a log read as far as it is whole and
    said so. A damaged line before the last is refused with its line number; so is any record lacking `fields`."""
    data = require_file(path, what).read_bytes()
    lines = data.split(b"\n")
    records, note = [], None
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        last = number == len(lines)  # no newline after it: the writer stopped mid-line
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            if last:
                note = f"{Path(path).name}: line {number} is half-written (a run still writing, or a crash); read " \
                       f"the {len(records)} whole records before it"
                break
            raise InputError(f"{what}: {Path(path).name} line {number} is not a JSON record ({err}); the file is "
                             "damaged") from None
        records.append(check_fields(record, fields or {}, f"{what}: {Path(path).name} line {number}"))
    return records, note


def read_safetensors_header(path: str | os.PathLike) -> dict[str, dict]:
    """Tensor name -> its header entry (dtype, shape, data_offsets) of a whole safetensors file, read without torch:
    the header's length is checked against the file before it is read, and the tensors must fill the file exactly
    (truncated, appended to or replaced files are named here, not deep inside a loader)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: {'not a regular file' if path.exists() else 'missing'}; the model has no weights")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 2 <= length <= size - 8:
            raise InputError(f"{path.name}: not a whole safetensors file ({size:,} bytes); the weights are damaged")
        header = f.read(length)
    try:
        entries = {name: t for name, t in json.loads(header.decode("utf-8")).items() if name != "__metadata__"}
        ends = [t["data_offsets"][1] for t in entries.values()]
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError, TypeError, KeyError, IndexError):
        raise InputError(f"{path.name}: the safetensors header is damaged; the weights cannot be read") from None
    if max(ends, default=0) != size - 8 - length:
        raise InputError(f"{path.name}: {size:,} bytes, its header describes {8 + length + max(ends, default=0):,}: "
                         "truncated or appended to")
    return entries


# The files that make a saved tokenizer folder loadable with AutoTokenizer (copied into checkpoints, shards and
# exports).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def check_regular_files(folder: Path) -> None:
    """Nothing in the folder that would block a reader or a copy (a FIFO, a device)."""
    for entry in folder.iterdir():
        if entry.exists() and not (entry.is_file() or entry.is_dir()):
            raise InputError(f"{entry}: not a regular file (a FIFO or device?); remove it")


def check_tokenizer_files(path: str | os.PathLike, chat_template: bool = False) -> Path:
    """A tokenizer folder's files, read without transformers: tokenizer.json and tokenizer_config.json JSON objects
    (the config required with `chat_template`: its special tokens, pad and end of turn, live there). Whether the
    chat template parses is modeling/loading.py's check_tokenizer_folder, which needs transformers' parser."""
    path = Path(path)
    check_regular_files(path)
    tokenizer_json = path / "tokenizer.json"
    if not tokenizer_json.exists() and not tokenizer_json.is_symlink():
        raise InputError(f"{path}: no tokenizer.json; measuring or chatting needs the model's own tokenizer next to "
                         "the weights")
    check_fields(read_json(tokenizer_json, f"{path}"), {"model": dict}, f"{path}: tokenizer.json")
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (path / name).exists() or (path / name).is_symlink():
            read_json(path / name, f"{path}")
        elif name == "tokenizer_config.json" and chat_template:
            raise InputError(f"{path}: no tokenizer_config.json; chatting and fine-tuning need the tokenizer's special "
                             "tokens: copy the tokenizer files back next to the weights")
    return path
