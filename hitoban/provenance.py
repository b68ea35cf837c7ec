"""Which model a number was measured on: its identity by content, and the lineage of a model folder.

A model's identity is the content of ALL its weight files and ALL its tokenizer files, never their names or their
presence. `weights_sha256`: the sha256 of `model.safetensors` when it is the only weight file (the file a user can
hash with `sha256sum`), otherwise of every weight file there is (`model.safetensors`, each `model-*-of-*.safetensors`
shard, the index), name and content, so a shard saved beside other weights changes it. `tokenizer_files_sha256`: the
same over every tokenizer file (tokenizer.json, its config, special tokens, `chat_template.jinja`, tokenizer.model).
Every artefact that measures a model records `weights_sha256`. Each model folder hitoban writes carries
`lineage.json`: both hashes and, for a fine-tune, its base's lineage (SFT output -> its base -> the pretraining run
that produced the base). `hitoban card` cites a number only when its artefact's weights are the carded model's or a
recorded ancestor's; `hitoban upload` compares the folder's identity with its lineage and its PII probe.
Lazy imports: importlib.metadata (a tenth of a second) only when the version is asked for."""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hitoban.errors import InputError, MissingInputError

LINEAGE_FILE = "lineage.json"
LLAMA_EXPORT_STAGE = "export-llama"  # the lineage stage of `hitoban export-llama`'s folders (card/upload read it)
# A folder holding a file of this name holds fake data planted on purpose (the PII probe's canaries, the demo's fake
# contacts): the secret scan reports it as test data instead of a leak.
TEST_DATA_MARKER = "HITOBAN_TEST_DATA"


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside `path`, renamed onto it when the block ends, removed if it fails: `path` is whole or
    untouched. The temporary name is unique to this call, so two writers of one file (DDP ranks, threads) never
    write into or rename each other's half-written file; the last rename wins, whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)  # `--out DIR/report.json` with DIR new: every writer, here once
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make every replaced file private
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: str | os.PathLike, data: dict) -> Path:
    """Write an artefact's JSON whole or not at all (`replacing`): UTF-8, indented. Every report a command writes
    says what it is (`kind`) and its format's version (`schema`); this refuses one that does not."""
    path = Path(path)
    if "kind" in data and "schema" not in data:
        raise ValueError(f"{path.name}: a '{data['kind']}' report without a schema version")
    with replacing(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    return path


def hitoban_version() -> str:
    """The installed hitoban's version, recorded in every manifest (a source tree that was not installed says so)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hitoban")
    except PackageNotFoundError:
        return "0.0.0+source"


def sha256_file(path: str | os.PathLike, block: int = 1 << 20) -> str:
    """Streamed sha256 of one file (never the whole file in memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


SINGLE_WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
SHARD_PATTERN = "model-*-of-*.safetensors"
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # a PEFT adapter folder: its weights are the adapter's
# Every file that decides how text becomes ids and back; a replaced chat template changes what a chat model reads.
TOKENIZER_IDENTITY_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                            "chat_template.jinja", "tokenizer.model")


def weight_files(model_dir: str | os.PathLike) -> list[str]:
    """The top-level weight files of a folder (single file, shards, index; else a PEFT adapter), sorted."""
    names = sorted(p.name for p in Path(model_dir).iterdir() if p.is_file() and (
        p.name in (SINGLE_WEIGHTS, WEIGHTS_INDEX) or fnmatch.fnmatchcase(p.name, SHARD_PATTERN)))
    if not names and (Path(model_dir) / ADAPTER_WEIGHTS).is_file():
        return [ADAPTER_WEIGHTS]
    return names


def _named_digest(model_dir: Path, names: list[str]) -> str:
    """One sha256 over (name, sha256) of each file: renaming, adding or changing any file changes it."""
    joined = "\n".join(f"{name} {sha256_file(model_dir / name)}" for name in names)
    return hashlib.sha256(joined.encode()).hexdigest()


def weights_sha256(model_dir: str | os.PathLike) -> str:
    """The identity of a folder's weights, all of them (raises FileNotFoundError when it has none, or when its
    index names a shard that is missing: such weights do not load, so they have no identity)."""
    model_dir = Path(model_dir)
    names = weight_files(model_dir) if model_dir.is_dir() else []
    if not names:
        raise MissingInputError(f"{model_dir}: no model.safetensors (or index) to hash, as regular files; save the "
                                "model again")
    if len(names) == 1 and names[0] in (SINGLE_WEIGHTS, ADAPTER_WEIGHTS):
        return sha256_file(model_dir / names[0])
    if WEIGHTS_INDEX in names:
        try:
            index = json.loads((model_dir / WEIGHTS_INDEX).read_text(encoding="utf-8"))
            shards = set(index["weight_map"].values())
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            raise InputError(f"{model_dir}/{WEIGHTS_INDEX}: not a weights index; save the model again") from None
        missing = sorted(shards - set(names))
        if missing:
            raise MissingInputError(f"{model_dir}: {WEIGHTS_INDEX} names missing shard(s) {missing}")
    return _named_digest(model_dir, names)


def tokenizer_files_sha256(model_dir: str | os.PathLike) -> str | None:
    """The identity of a folder's tokenizer, every file of it; None when it has no tokenizer.json."""
    model_dir = Path(model_dir)
    if not (model_dir / "tokenizer.json").is_file():
        return None
    return _named_digest(model_dir, [n for n in TOKENIZER_IDENTITY_FILES if (model_dir / n).is_file()])


def model_identity(model_dir: str | os.PathLike) -> dict:
    """{weights_sha256, tokenizer_files_sha256} of a folder as it is now (FileNotFoundError without weights)."""
    return {"weights_sha256": weights_sha256(model_dir), "tokenizer_files_sha256": tokenizer_files_sha256(model_dir)}


def read_lineage(model_dir: str | os.PathLike) -> dict | None:
    """The folder's lineage.json, None without one; one that is not a JSON object is a ValueError (callers refuse)."""
    path = Path(model_dir) / LINEAGE_FILE
    if not path.exists() and not path.is_symlink():
        return None
    lineage = None
    if path.is_file():  # never opened otherwise: a FIFO would block the gate that reads it
        try:
            lineage = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            pass
    if not isinstance(lineage, dict):
        raise InputError(f"{path}: not a lineage record (a JSON object in a regular file); restore the file "
                         "hitoban wrote")
    return lineage


def write_lineage(model_dir: str | os.PathLike, stage: str, base_dir: str | os.PathLike | None = None,
                  **facts) -> dict:
    """Record this folder's weights hash, what produced it (`stage`, `facts`) and its base's lineage."""
    model_dir = Path(model_dir)
    if (model_dir / "tokenizer.json").is_file():  # the tokenizer these weights read: a swapped one is refused later
        facts.setdefault("tokenizer_sha256", sha256_file(model_dir / "tokenizer.json"))
        facts["tokenizer_files_sha256"] = tokenizer_files_sha256(model_dir)
    lineage = {"stage": stage, "weights_sha256": weights_sha256(model_dir), **facts}
    if base_dir is not None:
        base = read_lineage(base_dir) or {"stage": "unknown", "weights_sha256": weights_sha256(base_dir)}
        lineage["base"] = {**base, "folder": Path(base_dir).name}
    (model_dir / LINEAGE_FILE).write_text(json.dumps(lineage, indent=2, ensure_ascii=False), encoding="utf-8")
    return lineage


def training_corpora(lineage: dict) -> dict[str, set[str]]:
    """What the chain was trained on, by content: "pretrain" -> the pretraining corpus sha256s (recorded as
    `corpus_sha256`) and shard-index sha256s (`data_index_sha256`, whose index names the corpus), "finetune" -> the
    sha256 of each fine-tuning data file (`data`)."""
    found: dict[str, set[str]] = {"corpus": set(), "data_index": set(), "finetune": set()}
    for node in ancestors(lineage):
        if node.get("corpus_sha256"):
            found["corpus"].add(node["corpus_sha256"])
        if node.get("data_index_sha256"):
            found["data_index"].add(node["data_index_sha256"])
        found["finetune"].update(d["sha256"] for d in node.get("data") or [] if isinstance(d, dict) and d.get("sha256"))
    return found


def ancestors(lineage: dict) -> list[dict]:
    """The lineage as a list, the model itself first, then its base, its base's base, ..."""
    chain, node = [], lineage
    while node:
        chain.append({k: v for k, v in node.items() if k != "base"})
        node = node.get("base")
    return chain
