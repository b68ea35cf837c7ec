"""`hitoban shards`: tokenize a corpus into zxell-format shards, and verify them (docs/design.md §5).

Layout of SHARDS/:
  shards_index.json            tokenizer name + sha256, dtype, shard_tokens, seed, split rule, domains, shards
  tokenizer/                   the tokenizer the ids belong to (training refuses any other)
  train_000.bin ...            headerless little-endian uint16 ids (uint32 when vocab > 65,535)
  train_000.bin.json ...       name, split, tokens, docs, sha256, per-domain token counts
  val_000.bin, test_000.bin    held-out splits, same format
  <split>_NNN.domains.u8       one byte per document: its domain id in index order (all splits)

Every document ends with exactly one <|end|> and never spans two shards; special-token ids inside a document's
text are removed (counted), so <|end|> always marks a document boundary. Val/test documents are chosen by a
deterministic rule (every k-th document of each source, capped in tokens); a train document whose text equals a
val/test document is dropped, so the splits are disjoint by content, not just by position. Train documents are
shuffled by seed before cutting, through a memory-mapped scratch file: memory stays bounded by one encode batch
plus one offset per document.
Shards encode through tokenizers' own `Tokenizer` (load_encoder), never transformers: importing transformers loads
torch, which cost `hitoban shards` about 4 s of start-up to encode text; `--verify` needs no tokenizer at all."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm.auto import tqdm

from hitoban.errors import InputError, OutputExistsError
from hitoban.files import TOKENIZER_FILES, check_fields, check_tokenizer_files, read_json
from hitoban.options import checked_against
from hitoban.provenance import sha256_file
from hitoban.training.data.corpus import iter_corpus, load_manifest
from hitoban.training.data.markers import SPECIAL_TOKENS, require_markers
from hitoban.training.data.options import (
    CONTEXT,
    DTYPES,
    MAX_HELDOUT_DOCS,
    SEED,
    SHARD_TOKENS,
    VAL_EVERY,
    ShardsOptions,
)
from hitoban.training.data.workers import (
    CHUNKS_PER_WORKER,
    WINDOW_PER_WORKER,
    InOrder,
    encode_documents,
    encoding_threads,
    processes,
)

FORMAT = "hitoban-shards/1 (zxell layout)"
# copied beside TOKENIZER_FILES into shards/tokenizer/
SHARD_TOKENIZER_EXTRA_FILES = ("tokenizer_meta.json", "sentencepiece.model")


class ShardError(InputError):
    """A shard set is incomplete, edited, or does not belong to the given tokenizer; names the file."""


def tokenizer_sha256(tokenizer_dir: Path) -> str:
    """Identity of a tokenizer: the hash of its `tokenizer.json` (vocab, scores, normaliser, specials)."""
    return sha256_file(Path(tokenizer_dir) / "tokenizer.json")


def dtype_for_vocab(vocab_size: int, requested: str | None = None) -> np.dtype:
    if requested == "uint16" and vocab_size > 65_535:
        raise ShardError(f"a vocabulary of {vocab_size} ids does not fit in uint16 (max 65,535); use --dtype uint32")
    if requested:
        return np.dtype(requested)
    return np.dtype(np.uint16 if vocab_size <= 65_535 else np.uint32)


def _text_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


class HeldoutRule:
    """The held-out rule, one document at a time in the corpus's order: per source, its document k goes to val if
    k % every == 0, to test if == 1, until a split holds `max_docs_per_split`. Each choice depends only on the
    documents before it, so the shards decide while they encode, in the one pass that reads the corpus."""

    def __init__(self, every: int, max_docs_per_split: int):
        self.every, self.max_docs = every, max_docs_per_split
        self.per_source: dict[str, int] = {}
        self.taken = {"val": 0, "test": 0}

    def split_of(self, source: str) -> str | None:
        """'val', 'test' or None (train) for the next document, of `source`."""
        k = self.per_source.get(source, 0)
        self.per_source[source] = k + 1
        split = {0: "val", 1: "test"}.get(k % self.every)
        if split and self.taken[split] < self.max_docs:
            self.taken[split] += 1
            return split
        return None


def choose_heldout(corpus: Path, every: int, max_docs_per_split: int) -> dict[int, str]:
    """Document index -> 'val' | 'test' by `HeldoutRule`, for the whole corpus (what the shards chose)."""
    rule = HeldoutRule(every, max_docs_per_split)
    return {index: split for index, record in enumerate(iter_corpus(corpus))
            if (split := rule.split_of(record["source"]))}


class _ShardWriter:
    """Writes one split's shards; cuts a new shard when the next document would overflow `shard_tokens`."""

    def __init__(self, folder: Path, split: str, dtype: np.dtype, shard_tokens: int, domains: list[str]):
        self.folder, self.split, self.dtype = folder, split, dtype
        self.shard_tokens, self.domains = shard_tokens, domains
        self.shards: list[dict] = []
        self._file = None

    def _open(self):
        name = f"{self.split}_{len(self.shards):03d}.bin"
        self._file = open(self.folder / name, "wb")
        self._digest = hashlib.sha256()
        self._meta = {"name": name, "split": self.split, "tokens": 0, "docs": 0,
                      "domains": {d: 0 for d in self.domains}}
        self._doc_domains: list[int] = []

    def add(self, ids: np.ndarray, domain: int) -> None:
        if self._file is None or (self._meta["tokens"] and self._meta["tokens"] + len(ids) > self.shard_tokens):
            self.close_shard()
            self._open()
        data = ids.astype(self.dtype).astype(self.dtype.newbyteorder("<")).tobytes()
        self._file.write(data)
        self._digest.update(data)
        self._meta["tokens"] += len(ids)
        self._meta["docs"] += 1
        self._meta["domains"][self.domains[domain]] += len(ids)
        self._doc_domains.append(domain)

    def close_shard(self) -> None:
        if self._file is None:
            return
        self._file.close()
        self._meta["sha256"] = self._digest.hexdigest()
        domains_file = self.folder / self._meta["name"].replace(".bin", ".domains.u8")
        np.asarray(self._doc_domains, dtype=np.uint8).tofile(domains_file)
        self._meta["domains_file"] = domains_file.name
        (self.folder / f"{self._meta['name']}.json").write_text(json.dumps(self._meta, indent=2))
        self.shards.append(self._meta)
        self._file = None


@dataclass
class _TrainScratch:
    """Pass 1's train documents, written one after another to a scratch file, to be shuffled in pass 2."""

    path: Path
    offsets: list[int] = field(default_factory=lambda: [0])
    domains: list[int] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)
    heldout_keys: set[bytes] = field(default_factory=set)
    markers_removed: int = 0


def load_encoder(folder: Path) -> Tokenizer:
    """The tokenizer as shards encode with it: tokenizers' `Tokenizer` from the folder's tokenizer.json, the backend
    AutoTokenizer wraps (its ids are the same: tests/training/data/test_shards.py), with the hitoban markers checked
    as single tokens. The chat template is not parsed here (copied only): chatting and fine-tuning check it."""
    check_tokenizer_files(folder)
    try:
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as err:  # noqa: BLE001 - tokenizers raises a bare Exception for a file it cannot read
        raise InputError(f"{folder}/tokenizer.json: tokenizers cannot read it ({str(err)[:200]}); train the tokenizer "
                         "again with `hitoban tokenizer`") from None
    require_markers(folder, tok.token_to_id)
    return tok


class DocumentEncoder:
    """A document as the shards hold it: its ids with any marker inside the text removed (a literal "<|end|>" must
    not fake a document boundary) and one <|end|> appended, in the shards' dtype; with the markers removed and the
    text's key (held-out copies in train are dropped by it). The same in the writing process (one worker) and in
    each worker process."""

    def __init__(self, tok: Tokenizer, np_dtype: np.dtype):
        self.tok, self.np_dtype = tok, np_dtype
        self.end_id = tok.token_to_id("<|end|>")
        self.special_ids = np.array([tok.token_to_id(t) for t in SPECIAL_TOKENS])

    def __call__(self, texts: list[str]) -> list[tuple[np.ndarray, int, bytes]]:
        encoded = []
        for text, encoding in zip(texts, encode_documents(self.tok, texts)):
            ids = np.asarray(encoding.ids, dtype=np.int64)
            inside = np.isin(ids, self.special_ids)
            removed = int(inside.sum())
            if removed:
                ids = ids[~inside]
            encoded.append((np.append(ids, self.end_id).astype(self.np_dtype), removed, _text_key(text)))
        return encoded


_WORKER_ENCODER: DocumentEncoder | None = None  # a worker process's, set once by `_start_encoder`


def _start_encoder(tokenizer: str, dtype: str) -> None:
    global _WORKER_ENCODER
    encoding_threads(1)  # the processes are the parallelism: one encoder thread each
    _WORKER_ENCODER = DocumentEncoder(load_encoder(Path(tokenizer)), np.dtype(dtype))


def _encode_in_worker(records: list[dict]) -> list[tuple[np.ndarray, int, bytes]]:
    return _WORKER_ENCODER([record["text"] for record in records])


def _encoded(records: Iterator[dict], encode: DocumentEncoder, batch_docs: int, pool, workers: int):
    """(record, its `encode`d document) for every record, in order: batches encoded here (tokenizers' threads), or
    windows encoded by `pool`'s processes while this one writes the last (its reading, converting and writing were
    a fifth of a 2-thread build, serial beside the encoder)."""
    if pool is None:
        while batch := [r for _, r in zip(range(batch_docs), records)]:
            yield from zip(batch, encode([r["text"] for r in batch]))
        return
    # one call of the encoder a chunk (a call per document encoded a sixth slower)
    yield from InOrder(pool, _encode_in_worker, records, workers * WINDOW_PER_WORKER, workers * CHUNKS_PER_WORKER)


def _split_documents(corpus: Path, tokenizer: Path, encode: DocumentEncoder, heldout: HeldoutRule, writers: dict,
                     domains: list[str], scratch_path: Path, batch_docs: int, progress: bool, workers: int,
                     documents: int) -> _TrainScratch:
    """Pass 1: tokenize every document (`DocumentEncoder`, here or in `workers` processes) and send it to its
    held-out writer (`heldout` decides, in order) or to the train scratch file; `documents`: the bar's total."""
    scratch = _TrainScratch(scratch_path)
    # the workers first: forked before a progress bar starts its monitor thread (workers.processes)
    with (processes(workers, _start_encoder, (str(tokenizer), encode.np_dtype.name)) if workers > 1
          else nullcontext()) as pool, open(scratch_path, "wb") as out:
        bar = tqdm(total=documents, unit="doc", desc="shards", disable=not progress or None)
        for record, (ids, removed, key) in _encoded(iter_corpus(corpus), encode, batch_docs, pool, workers):
            scratch.markers_removed += removed
            domain = domains.index(record["source"])
            split = heldout.split_of(record["source"])
            if split:
                writers[split].add(ids, domain)
                scratch.heldout_keys.add(key)
            else:
                out.write(ids.tobytes())
                scratch.offsets.append(scratch.offsets[-1] + len(ids))
                scratch.domains.append(domain)
                scratch.keys.append(key)
            bar.update(1)
    bar.close()
    for writer in writers.values():
        writer.close_shard()
    return scratch


def _write_shuffled_train(scratch: _TrainScratch, tmp: Path, np_dtype, shard_tokens: int, domains: list[str],
                          seed: int, progress: bool) -> tuple[_ShardWriter, int]:
    """Pass 2: the train documents in a seeded shuffle, minus any whose text equals a held-out document. Returns
    the writer and how many were dropped as duplicates."""
    offsets = np.asarray(scratch.offsets, dtype=np.int64)
    keep = np.array([key not in scratch.heldout_keys for key in scratch.keys], dtype=bool)
    order = np.random.default_rng(seed).permutation(len(scratch.domains))
    order = order[keep[order]]
    train_writer = _ShardWriter(tmp, "train", np_dtype, shard_tokens, domains)
    if len(order):
        source = np.memmap(scratch.path, dtype=np_dtype, mode="r")
        for doc in tqdm(order, desc="shuffle", unit="doc", disable=not progress or None):
            train_writer.add(np.asarray(source[offsets[doc] : offsets[doc + 1]]), scratch.domains[doc])
        del source
    train_writer.close_shard()
    scratch.path.unlink()
    return train_writer, int((~keep).sum())


@checked_against(ShardsOptions, "shard_tokens", "seed", "val_every", "max_heldout_docs", "context", "workers")
def build_shards(
    corpus: str | os.PathLike,
    tokenizer: str | os.PathLike,
    out: str | os.PathLike,
    shard_tokens: int = SHARD_TOKENS,
    seed: int = SEED,
    val_every: int = VAL_EVERY,
    max_heldout_docs: int = MAX_HELDOUT_DOCS,
    context: int = CONTEXT,
    dtype: str | None = None,
    batch_docs: int = 1000,
    progress: bool = True,
    workers: int | None = None,
) -> dict:
    """Corpus folder + tokenizer folder -> verified shard folder `out` (temp dir + rename). Returns the index.
    `workers`: 2 or more, processes that encode while this one reads and writes; 1, this process on one encoder
    thread; None, this process on tokenizers' threads, one per core. The shards are the same for any number."""
    if workers == 1:
        encoding_threads(1)
    started = time.time()
    corpus, tokenizer, out = Path(corpus), Path(tokenizer), Path(out)
    if out.exists():
        raise OutputExistsError(f"{out} already exists; remove it or choose another --out")
    manifest = load_manifest(corpus)
    tok = load_encoder(tokenizer)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    np_dtype = dtype_for_vocab(vocab, dtype)
    end_id = tok.token_to_id("<|end|>")
    domains = [s["name"] for s in manifest["sources"]]
    if len(domains) > 255:
        raise ShardError("more than 255 domains do not fit in the one-byte .domains.u8 files")
    heldout = HeldoutRule(val_every, max_heldout_docs)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp"))
    try:
        writers = {s: _ShardWriter(tmp, s, np_dtype, shard_tokens, domains) for s in ("val", "test")}
        scratch = _split_documents(corpus, tokenizer, DocumentEncoder(tok, np_dtype), heldout, writers, domains,
                                   tmp / "train.scratch", batch_docs, progress, workers or 1,
                                   manifest["total_documents"])
        train_writer, dropped_overlap = _write_shuffled_train(scratch, tmp, np_dtype, shard_tokens, domains, seed,
                                                              progress)
        markers_removed = scratch.markers_removed
        train_tokens = sum(s["tokens"] for s in train_writer.shards)
        if train_tokens < context + 1:
            raise ShardError(
                f"the train split has {train_tokens} tokens, fewer than one context window ({context} + 1); "
                "give the corpus more text or pass a smaller --context"
            )
        keep = (*TOKENIZER_FILES, *SHARD_TOKENIZER_EXTRA_FILES)
        shutil.copytree(tokenizer, tmp / "tokenizer", ignore=lambda d, names: [n for n in names if n not in keep])
        shards = train_writer.shards + writers["val"].shards + writers["test"].shards
        splits = {s: {"tokens": sum(x["tokens"] for x in shards if x["split"] == s),
                      "docs": sum(x["docs"] for x in shards if x["split"] == s),
                      "shards": [x["name"] for x in shards if x["split"] == s]} for s in ("train", "val", "test")}
        index_doc = {
            "format": FORMAT,
            "tokenizer": {"name": tokenizer.name, "sha256": tokenizer_sha256(tokenizer), "vocab_size": vocab,
                          "end_id": int(end_id)},
            "dtype": np_dtype.name,
            "shard_tokens": shard_tokens,
            "seed": seed,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "split_rule": {"val_every": val_every, "max_docs_per_heldout_split": max_heldout_docs,
                           "rule": "per source, document k: k % val_every == 0 -> val, == 1 -> test"},
            "splits": splits,
            "domains": domains,
            "corpus": {"sha256": manifest["output"]["sha256"], "documents": manifest["total_documents"]},
            "markers_removed": markers_removed,
            "train_docs_dropped_as_heldout_duplicates": dropped_overlap,
            "shards": shards,
            "elapsed_seconds": round(time.time() - started, 2),
        }
        (tmp / "shards_index.json").write_text(json.dumps(index_doc, indent=2, ensure_ascii=False))
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return index_doc


INDEX_FIELDS = {"dtype": str, "tokenizer": dict, "shards": list, "splits": dict, "domains": list}
TOKENIZER_FIELDS = {"vocab_size": int, "end_id": int, "sha256": str}
SHARD_FIELDS = {"name": str, "split": str, "tokens": int, "docs": int, "sha256": str}


def load_index(folder: str | os.PathLike) -> dict:
    """A shard folder's index, checked once here (fields, types, ranges, file names) for every reader."""
    path = Path(folder) / "shards_index.json"
    if not path.exists() and not path.is_symlink():
        raise ShardError(f"{folder}: no shards_index.json (not a shard folder, or an interrupted build)")
    try:
        index = read_json(path, f"{folder}", made_by="`hitoban shards`", fields=INDEX_FIELDS)
        check_fields(index["tokenizer"], TOKENIZER_FIELDS, f"{path.name}: tokenizer")
        for shard in index["shards"]:
            check_fields(shard, SHARD_FIELDS, f"{path.name}: a shard")
            _check_shard_entry(shard, index)
    except InputError as err:
        raise ShardError(str(err)) from None
    if index["dtype"] not in DTYPES:
        raise ShardError(f"{path.name}: dtype {index['dtype']!r} is neither uint16 nor uint32; the index is damaged")
    return index


def _check_shard_entry(shard: dict, index: dict) -> None:
    """A listed shard is a plain file name of this folder, with counts that can be true."""
    names = [shard["name"]] + ([shard["domains_file"]] if "domains_file" in shard else [])
    if any(not isinstance(n, str) or Path(n).name != n or n.startswith(".") for n in names):
        raise ShardError(f"shards_index.json lists {names!r}: not a file of this folder; the index is damaged")
    if shard["tokens"] < 0 or shard["docs"] < 0 or shard["split"] not in ("train", "val", "test"):
        raise ShardError(f"shards_index.json: {shard['name']} has impossible counts or split; the index is damaged")


def shard_file(folder: Path, name: str) -> Path:
    """A member file of the shard folder, refused when it is missing or not a regular file (a FIFO would block)."""
    path = folder / name
    if not path.is_file():
        raise ShardError(f"{name}: {'missing' if not path.exists() else 'not a regular file'} (listed in "
                         "shards_index.json)")
    return path


def verify_shards(folder: str | os.PathLike, tokenizer: str | os.PathLike | None = None, full: bool = True,
                  progress: bool = False) -> dict:
    """Check every invariant; `full=False` checks only sizes and boundaries (what training does at start).

    Raises ShardError naming the first broken file. Returns a summary on success.
    """
    folder = Path(folder)
    index = load_index(folder)
    dtype = np.dtype(index["dtype"]).newbyteorder("<")
    vocab, end_id = index["tokenizer"]["vocab_size"], index["tokenizer"]["end_id"]
    if tokenizer is not None and tokenizer_sha256(Path(tokenizer)) != index["tokenizer"]["sha256"]:
        raise ShardError(f"{folder}: these shards were made with another tokenizer than {Path(tokenizer).name} "
                         "(tokenizer.json sha256 differs); rebuild the shards or use the tokenizer they name")
    copy = folder / "tokenizer" / "tokenizer.json"
    if copy.exists() or copy.is_symlink():
        shard_file(folder, "tokenizer/tokenizer.json")
        if tokenizer_sha256(folder / "tokenizer") != index["tokenizer"]["sha256"]:
            raise ShardError(f"{folder}/tokenizer: tokenizer.json does not match the sha256 in shards_index.json")
    heldout_keys, train_keys = set(), []
    for shard in tqdm(index["shards"], desc="verify", disable=not progress or None):
        path = shard_file(folder, shard["name"])
        expected = shard["tokens"] * dtype.itemsize
        if path.stat().st_size != expected:
            raise ShardError(f"{shard['name']}: {path.stat().st_size} bytes, expected {expected} "
                             f"({shard['tokens']} tokens): truncated or overwritten")
        data = np.memmap(path, dtype=dtype, mode="r")
        if shard["tokens"] and data[-1] != end_id:
            raise ShardError(f"{shard['name']}: does not end with <|end|>: a document was cut")
        if not full:
            continue
        if sha256_file(path) != shard["sha256"]:
            raise ShardError(f"{shard['name']}: sha256 differs from shards_index.json: the file was edited")
        if int(data.max(initial=0)) >= vocab:
            raise ShardError(f"{shard['name']}: token id {int(data.max())} outside the vocabulary ({vocab})")
        ends = np.flatnonzero(data == end_id)
        if len(ends) != shard["docs"]:
            raise ShardError(f"{shard['name']}: {len(ends)} documents found, {shard['docs']} listed")
        if "domains_file" in shard:
            domains = np.fromfile(shard_file(folder, shard["domains_file"]), dtype=np.uint8)
            if len(domains) != shard["docs"] or (len(domains) and domains.max() >= len(index["domains"])):
                raise ShardError(f"{shard['domains_file']}: {len(domains)} entries for {shard['docs']} documents "
                                 "or an unknown domain id")
        starts = np.concatenate([[0], ends[:-1] + 1])
        keys = [hashlib.blake2b(data[s : e + 1].tobytes(), digest_size=16).digest() for s, e in zip(starts, ends)]
        (train_keys.extend(keys) if shard["split"] == "train" else heldout_keys.update(keys))
    overlap = sum(key in heldout_keys for key in train_keys)
    if overlap:
        raise ShardError(f"{overlap} train documents are identical to val/test documents: the splits leak")
    return {"shards": len(index["shards"]), "splits": {k: v["tokens"] for k, v in index["splits"].items()},
            "full": full, "ok": True}
