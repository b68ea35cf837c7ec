"""`hitoban corpus`: build a clean, licence-tracked pretraining corpus (docs/design.md §4).

Output folder: `documents.jsonl` (one `{"text", "source"}` object per line: streamable, and the source travels with
each document so shards can count tokens per domain) and `manifest.json` (sources with repo/revision/licence and
shares, filter settings, rejection counts, PII masks, output sha256, elapsed, tool version; no absolute paths) and
`pii_log.jsonl` (for each masked e-mail / phone number: its context as masked, a masked display value and keyed
digests, never the contact itself: what `hitoban pii` mines, since the masked text has nothing left to find).
Everything is written into a temporary sibling folder and renamed at the end: an interrupted or failed build never
leaves a folder that looks complete.
Lazy imports: `datasets` loads only for a Hub source, so a local build and `hitoban leaks` (which reads the corpus
manifest through here) start without it."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

from tqdm.auto import tqdm

from hitoban.errors import InputError, OutputExistsError
from hitoban.files import check_fields, decode_error, read_json, read_text, require_file
from hitoban.options import checked_against
from hitoban.provenance import hitoban_version
from hitoban.training.data.filters import REASONS, DocumentFilter, FilterSettings, PIIMasker
from hitoban.training.data.options import (
    DECODE_ERRORS,
    ENCODING,
    HUB_SOURCE_NAMES,
    LOCAL_LICENSE,
    SEED,
    TEXT_FIELD,
    CorpusOptions,
)
from hitoban.training.data.workers import Examiners, examiners

# Pinned revisions (3LM's): a rebuilt corpus is the same corpus.
HUB_SOURCES = {
    "fineweb2-ja": dict(repo="HuggingFaceFW/fineweb-2", revision="af9c13333eb981300149d5ca60a8e9d659b276b9",
                        config="jpn_Jpan", data_files=None, license="ODC-By 1.0", text_field="text"),
    "aozora": dict(repo="globis-university/aozorabunko-clean", revision="42a9c9c0f1d67e6a5554d9bea4201973dc9b049c",
                   config=None, data_files="aozorabunko-dedupe-clean.jsonl.gz", license="CC BY 4.0",
                   text_field="text"),
}
DEFAULT_SHARES = {"aozora": 0.10}  # 3LM: Aozora 10%, FineWeb-2 the rest
assert tuple(HUB_SOURCES) == HUB_SOURCE_NAMES, "corpus --source offers options.HUB_SOURCE_NAMES"


def builtin_documents() -> list[str]:
    """The original Japanese text shipped with hitoban, one document per blank-line-separated block."""
    text = files("hitoban.data").joinpath("builtin_ja.txt").read_text(encoding="utf-8")
    return [block.strip() for block in text.split("\n\n") if block.strip()]


PII_LOG = "pii_log.jsonl"  # masked-value log for `hitoban pii` (contexts + keyed digests, never a raw contact)


class CorpusInputError(InputError):
    """Bad input (unreadable file, wrong encoding, nothing usable): the message names the file and what to do."""


@dataclass(frozen=True)
class WholeFile:
    """A document that is a whole file, not yet read (`Source.unread_documents`)."""

    path: Path
    encoding: str
    errors: str

    def read(self) -> str:
        try:
            return read_text(self.path, "corpus file", self.encoding, self.errors)
        except InputError as err:
            raise CorpusInputError(str(err)) from None


@dataclass
class Source:
    """One input stream: a pinned Hub dataset or local files. `documents()` yields raw texts lazily."""

    name: str
    license: str
    repo: str | None = None
    revision: str | None = None
    paths: list[Path] = field(default_factory=list)
    text_field: str = TEXT_FIELD
    doc_per_file: bool = False
    blank_line_docs: bool = False
    encoding: str = ENCODING
    errors: str = DECODE_ERRORS[0]
    config: str | None = None
    data_files: str | None = None

    def describe(self) -> dict:
        if self.repo:
            return {"name": self.name, "repo": self.repo, "revision": self.revision, "license": self.license}
        return {"name": self.name, "files": sorted(p.name for p in self.paths), "license": self.license}

    def documents(self) -> Iterator[str]:
        for document in self.unread_documents():
            yield document if isinstance(document, str) else document.read()

    def unread_documents(self) -> Iterator[str | WholeFile]:
        """`documents`, but a document that is a whole file comes unread: whoever examines it reads it (a worker
        process), so the one writing process, whose serial work caps a build on many cores, neither reads nor
        decodes it, and its text is not pickled on the way to the worker."""
        if self.repo:
            yield from self._hub_documents()
            return
        for path in self.paths:
            if path.suffix == ".jsonl":
                yield from self._jsonl(path)
            elif path.suffix == ".parquet":
                yield from self._parquet(path)
            elif self.doc_per_file:
                yield WholeFile(path, self.encoding, self.errors)
            elif self.blank_line_docs:
                yield from self._txt_blocks(path)
            else:
                yield from self._txt_lines(path)

    def _hub_documents(self) -> Iterator[str]:
        from datasets import load_dataset  # streaming: never downloads a whole parquet into memory

        dataset = load_dataset(self.repo, name=self.config, data_files=self.data_files, split="train",
                               streaming=True, revision=self.revision)
        for row in dataset:
            yield row[self.text_field]

    def _decode_error(self, path: Path, err: UnicodeDecodeError, offset: int) -> CorpusInputError:
        return CorpusInputError(str(decode_error(path, err, offset, self.encoding)))

    def _raw_lines(self, path: Path) -> Iterator[tuple[int, str]]:
        """(line number, decoded line), decoding per line so an error can name its exact byte offset."""
        offset = 0
        with open(path, "rb") as f:
            for number, raw in enumerate(f, 1):
                try:
                    yield number, raw.decode(self.encoding, errors=self.errors)
                except UnicodeDecodeError as err:
                    raise self._decode_error(path, err, offset) from None
                offset += len(raw)

    def _txt_lines(self, path: Path) -> Iterator[str]:
        for _, line in self._raw_lines(path):
            if line.strip():
                yield line.rstrip("\n")

    def _txt_blocks(self, path: Path) -> Iterator[str]:
        """Documents separated by blank lines (one paragraph per line inside), as in many web dumps."""
        block: list[str] = []
        for _, line in self._raw_lines(path):
            if line.strip():
                block.append(line.rstrip("\n"))
            elif block:
                yield "\n".join(block)
                block = []
        if block:
            yield "\n".join(block)

    def _jsonl(self, path: Path) -> Iterator[str]:
        for number, line in self._raw_lines(path):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise CorpusInputError(f"{path.name}:{number}: not valid JSON ({err.msg})") from None
            text = record.get(self.text_field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise CorpusInputError(f"{path.name}:{number}: no string field {self.text_field!r} "
                                       f"(use --text-field NAME)")
            yield text

    def _parquet(self, path: Path) -> Iterator[str]:
        from datasets import load_dataset

        for row in load_dataset("parquet", data_files=str(path), split="train", streaming=True):
            yield row[self.text_field]


def local_source(inputs: list[str], name: str | None = None, license: str = LOCAL_LICENSE,
                 **options) -> Source:
    """Expand files, globs and directories (a directory = its .txt/.jsonl/.parquet files; .txt there = one doc each)."""
    paths: list[Path] = []
    doc_per_file = options.pop("doc_per_file", False)
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".jsonl", ".parquet"))
            doc_per_file = doc_per_file or any(p.suffix == ".txt" for p in found)
            paths += found
        elif any(ch in item for ch in "*?["):
            paths += sorted(Path(p) for p in glob.glob(item, recursive=True))
        elif path.exists():
            paths.append(path)
        else:
            raise CorpusInputError(f"{item}: no such file or directory")
    if not paths:
        raise CorpusInputError(f"no input files found in {inputs}")
    stem = name or (Path(inputs[0]).stem if len(inputs) == 1 else "local")
    return Source(name=stem, license=license, paths=paths, doc_per_file=doc_per_file, **options)


def hub_source(name: str) -> Source:
    if name not in HUB_SOURCES:
        raise CorpusInputError(f"unknown source {name!r}; choose from {sorted(HUB_SOURCES)} or give local files")
    spec = HUB_SOURCES[name]
    return Source(name=name, license=spec["license"], repo=spec["repo"], revision=spec["revision"],
                  config=spec["config"], data_files=spec["data_files"], text_field=spec["text_field"])


def source_targets(sources: list[Source], target_chars: int | None, shares: dict[str, float]) -> dict[str, float]:
    """Characters to take from each source: explicit shares first, the rest split evenly (3LM: no top-up)."""
    if target_chars is None:
        return {s.name: float("inf") for s in sources}
    given = {s.name: shares[s.name] for s in sources if s.name in shares}
    if sum(given.values()) > 1 + 1e-9:
        raise CorpusInputError(f"source shares add up to more than 1: {given}")
    rest = [s.name for s in sources if s.name not in given]
    if not rest and abs(sum(given.values()) - 1) > 1e-9 and len(sources) == len(given):
        given = {k: v / sum(given.values()) for k, v in given.items()}
    each = (1 - sum(given.values())) / len(rest) if rest else 0.0
    return {s.name: target_chars * given.get(s.name, each) for s in sources}


@checked_against(CorpusOptions, "target_chars", "seed", "workers")
def build_corpus(
    sources: list[Source],
    out: str | os.PathLike,
    target_chars: int | None = None,
    shares: dict[str, float] | None = None,
    settings: FilterSettings | None = None,
    mask_pii: bool = True,
    seed: int = SEED,
    progress: bool = True,
    workers: int = 1,
) -> dict:
    """Stream every source through the filters and the PII masker into `out`; returns the manifest. `workers`
    processes run the per-document filters (training/data/workers.py); the output is the same for any number."""
    started = time.time()
    out = Path(out)
    if out.exists():
        raise OutputExistsError(f"{out} already exists; remove it or choose another --out")
    if not sources:
        raise CorpusInputError("no sources: give --input PATH and/or --source NAME")
    settings = settings or FilterSettings()
    masker = PIIMasker(salt=os.urandom(16) if mask_pii else None)  # salt: keyed digests in the masked-value log
    targets = source_targets(sources, target_chars, {**DEFAULT_SHARES, **(shares or {})} if len(sources) > 1 else {})
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp"))
    try:
        # the workers first: forked before a progress bar starts its monitor thread (workers.examiners)
        with examiners(settings, workers, (masker.salt,) if mask_pii else None) as examining:
            doc_filter = DocumentFilter(settings)
            per_source, seen_total, sha256 = _write_documents(
                tmp, sources, targets, doc_filter, masker if mask_pii else None, target_chars, progress, examining)
        if not mask_pii:
            (tmp / PII_LOG).unlink()
        _refuse_empty(per_source, seen_total, doc_filter, settings)
        total_chars = sum(s["chars"] for s in per_source)
        for s in per_source:
            s["share"] = round(s["chars"] / total_chars, 4)
        manifest = {
            "tool": f"hitoban {hitoban_version()}",
            "target_chars": target_chars,
            "total_chars": total_chars,
            "total_documents": sum(s["documents"] for s in per_source),
            "seed": seed,
            "sources": per_source,
            "filters": {**settings.to_dict(), "rejected": dict(doc_filter.rejected),
                        "truncated": doc_filter.truncated, "long_documents": doc_filter.long,
                        "split_pieces": doc_filter.split_pieces},
            "characters": character_account(doc_filter),
            "pii_masks": {"enabled": mask_pii, **dict(masker.counts),
                          "log": PII_LOG if mask_pii else None},
            "output": {"name": "documents.jsonl", "sha256": sha256,
                       "bytes": (tmp / "documents.jsonl").stat().st_size},
            "elapsed_seconds": round(time.time() - started, 2),
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, ensure_ascii=False, indent=2), encoding="utf-8")
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _write_documents(tmp: Path, sources: list[Source], targets: dict[str, float], doc_filter: DocumentFilter,
                     masker: PIIMasker | None, target_chars: int | None,
                     progress: bool, examining: Examiners) -> tuple[list[dict], int, str]:
    """Stream each source, in order, through the filters (and `masker`, unless PII masking is off) into
    `tmp/documents.jsonl` until the source's share of characters is reached; the sha256 is taken while writing so
    the finished file is never read again. Returns each source's counts, the documents read, and the sha256."""
    digest, per_source, seen_total = hashlib.sha256(), [], 0
    with open(tmp / "documents.jsonl", "wb") as writer, open(tmp / PII_LOG, "w", encoding="utf-8") as pii_log:
        bar = tqdm(total=target_chars, unit="char", unit_scale=True, desc="corpus", disable=not progress or None)
        for source in sources:
            docs = chars = seen = 0
            after_text = f', "source": {json.dumps(source.name, ensure_ascii=False)}}}\n'.encode()
            for found in examining.examined(source.unread_documents()):
                seen += 1
                for piece in doc_filter.admit(found):  # a long document's pieces are documents of their own
                    if masker is not None:
                        _masked(found.masked[piece], masker, pii_log)
                    line = b'{"text": ' + found.encoded[piece] + after_text  # json.dumps of the record, in bytes
                    writer.write(line)
                    digest.update(line)
                    docs, chars = docs + 1, chars + found.written[piece]
                    bar.update(found.written[piece])
                    if chars >= targets[source.name]:
                        break
                if chars >= targets[source.name]:
                    break
            seen_total += seen
            per_source.append({**source.describe(), "documents_seen": seen, "documents": docs, "chars": chars})
        bar.close()
    return per_source, seen_total, digest.hexdigest()


def character_account(doc_filter: DocumentFilter) -> dict:
    """Where every character read went: kept (before PII masking), removed by cleaning (boilerplate, control
    characters, runs of whitespace), or dropped, by reason (`truncated`: cut off by `--long-docs truncate`); and the
    share kept of what passed the filters, the number a user who brings novels asks for."""
    counts = doc_filter.chars
    dropped = {reason: counts[reason] for reason in (*REASONS, "truncated") if counts[reason]}
    passed = counts["kept"] + counts["truncated"]
    return {"read": counts["read"], "kept": counts["kept"], "cleaned_away": counts["cleaned_away"],
            "dropped": dropped, "kept_of_passing": round(counts["kept"] / passed, 6) if passed else None}


def _masked(masked: tuple, masker: PIIMasker, pii_log) -> None:
    """A kept piece as it was masked where it was examined (`filters.mask_pieces`): its counts added to the
    corpus's, its sealed values logged now, so the log follows the documents' order and holds one piece's values."""
    _, counts, sealed_values = masked
    masker.counts.update(counts)
    for sealed in sealed_values:
        pii_log.write(json.dumps(sealed, ensure_ascii=False) + "\n")


def _refuse_empty(per_source: list[dict], seen_total: int, doc_filter: DocumentFilter,
                  settings: FilterSettings) -> None:
    """A corpus with no document must not be written: say whether the input itself was empty or every document was
    rejected (with the rejection counts and the thresholds, which are what the user can change)."""
    if seen_total == 0:
        raise CorpusInputError("the input is empty: no documents were read")
    if sum(s["documents"] for s in per_source) == 0:
        raise CorpusInputError(
            f"every document was rejected ({dict(doc_filter.rejected)}); check the input language and "
            f"lengths (min {settings.min_chars} chars, Japanese ratio >= {settings.min_japanese_ratio})"
        )


MANIFEST_FIELDS = {"total_chars": int, "total_documents": int, "sources": list, "output": dict}
OUTPUT_FIELDS = {"sha256": str, "bytes": int}


def iter_corpus(corpus: str | os.PathLike) -> Iterator[dict]:
    """Stream `{"text", "source"}` records of a built corpus: complete (the manifest's size, then its sha256 once
    read to the end) and every line a record, or one line naming the file and line that is not."""
    corpus = Path(corpus)
    if not (corpus / "manifest.json").exists() or not (corpus / "documents.jsonl").exists():
        raise CorpusInputError(f"{corpus} is not a hitoban corpus (documents.jsonl + manifest.json); "
                               "build one with `hitoban corpus`")
    output = load_manifest(corpus)["output"]
    path = require_file(corpus / "documents.jsonl", f"--corpus {corpus}", made_by="`hitoban corpus`")
    if path.stat().st_size != output["bytes"]:
        raise CorpusInputError(f"{path.name}: {path.stat().st_size:,} bytes, the manifest says {output['bytes']:,}: "
                               "truncated or edited; rebuild the corpus with `hitoban corpus`")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            digest.update(raw)
            yield _corpus_record(raw, path, number)
    if digest.hexdigest() != output["sha256"]:
        raise CorpusInputError(f"{path.name}: sha256 differs from manifest.json: the file was edited; rebuild the "
                               "corpus with `hitoban corpus`")


def _corpus_record(raw: bytes, path: Path, number: int) -> dict:
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorpusInputError(f"{path.name} line {number}: not a JSON record ({type(err).__name__}); the corpus is "
                               "damaged, rebuild it with `hitoban corpus`") from None
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise CorpusInputError(f"{path.name} line {number}: no 'text' string; the corpus is damaged")
    return record


def load_manifest(corpus: str | os.PathLike) -> dict:
    """A corpus folder's manifest (fields and types checked here), or one line saying what is wrong with it."""
    where = f"--corpus {corpus} is not a hitoban corpus folder"
    manifest = read_json(Path(corpus) / "manifest.json", where, made_by="`hitoban corpus --input FILES --out FOLDER`",
                         fields=MANIFEST_FIELDS)
    check_fields(manifest["output"], OUTPUT_FIELDS, "manifest.json: output")
    for source in manifest["sources"]:
        check_fields(source, {"name": str}, "manifest.json: a source")
    if manifest["total_chars"] < 0 or manifest["total_documents"] < 0:
        raise CorpusInputError("manifest.json: negative counts; the manifest is damaged")
    return manifest
