"""Which weights a number was measured on: the sha256 of a model's weights and the lineage of a model folder.

Every artefact that measures a model records `weights_sha256` (the sha256 of its `model.safetensors`, the file a
user can hash with `sha256sum`; for sharded weights, of the index file's weight map with each shard's sha256). Each
model folder hitoban writes carries `lineage.json`: its own weights hash and, for a fine-tune, its base's lineage
(SFT output -> its base -> the pretraining run that produced the base). `hitoban card` cites a number only when its
artefact's weights are the carded model's or a recorded ancestor's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

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


def weights_sha256(model_dir: str | os.PathLike) -> str:
    """sha256 of a from_pretrained folder's weights (raises FileNotFoundError when it has none)."""
    model_dir = Path(model_dir)
    single = model_dir / "model.safetensors"
    if single.exists():
        return sha256_file(single)
    adapter = model_dir / "adapter_model.safetensors"  # a PEFT adapter folder: its weights are the adapter's
    if adapter.exists():
        return sha256_file(adapter)
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        joined = "\n".join(f"{name} {sha256_file(model_dir / name)}" for name in shards)
        return hashlib.sha256(joined.encode()).hexdigest()
    raise FileNotFoundError(f"{model_dir}: no model.safetensors (or index) to hash")


def read_lineage(model_dir: str | os.PathLike) -> dict | None:
    path = Path(model_dir) / LINEAGE_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def write_lineage(model_dir: str | os.PathLike, stage: str, base_dir: str | os.PathLike | None = None,
                  **facts) -> dict:
    """Record this folder's weights hash, what produced it (`stage`, `facts`) and its base's lineage."""
    model_dir = Path(model_dir)
    if (model_dir / "tokenizer.json").is_file():  # the tokenizer these weights read: a swapped one is refused later
        facts.setdefault("tokenizer_sha256", sha256_file(model_dir / "tokenizer.json"))
    lineage = {"stage": stage, "weights_sha256": weights_sha256(model_dir), **facts}
    if base_dir is not None:
        base = read_lineage(base_dir) or {"stage": "unknown", "weights_sha256": weights_sha256(base_dir)}
        lineage["base"] = {**base, "folder": Path(base_dir).name}
    (model_dir / LINEAGE_FILE).write_text(json.dumps(lineage, indent=2, ensure_ascii=False), encoding="utf-8")
    return lineage


def ancestors(lineage: dict) -> list[dict]:
    """The lineage as a list, the model itself first, then its base, its base's base, ..."""
    chain, node = [], lineage
    while node:
        chain.append({k: v for k, v in node.items() if k != "base"})
        node = node.get("base")
    return chain
