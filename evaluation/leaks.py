"""`hitoban leaks`: exact scan of corpora for held-out text (SPEC §7, 3LM §8).

Probes: for each holdout line (chat markers removed, whitespace collapsed) of >= 48 chars, 3 probes of 48 chars at
the start, middle and end, each extended until it is >= 96 UTF-8 bytes (3LM's construction). The corpus is read
in chunks that overlap by (longest probe - 1) bytes, so a match straddling a chunk border is seen whole; every
candidate is confirmed byte for byte and counted once per absolute offset: no false negatives, no false positives.
Before every scan a self-test plants a needle across chunk borders and requires exactly the planted count.

Engines (the report names the one that ran):
- `sampled-grams` (default): NumPy over the text's aligned 8-byte words. Any occurrence of a probe of >= 23 bytes
  covers one 16-byte gram that starts on an 8-byte boundary of the text, at offset 0..7 of the probe; the 8
  possible grams of every probe are hashed into a 1 MiB bitmap, so the scan is a few vectorised passes over
  len/8 words, and only exact 64-bit key matches reach the byte-for-byte check.
- `hyperscan` (Intel's multi-literal matcher) and `ahocorasick-rs`, for short probes or as a cross-check.
A `hitoban corpus` folder is scanned through its documents.jsonl, with JSON-escaped probe variants so a quote or
backslash in the text cannot hide a leak.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from hitoban.errors import InputError

MARKERS = re.compile(r"<\|(?:user|assistant|end|endoftext|unk)\|>")
CHUNK = 16 * 2**20


class LeakScanError(InputError):
    """Bad input for the scan (missing or empty holdout/corpus) or a failed self-test."""


def make_probes(lines: Iterable[str], length: int = 48, per_line: int = 3, min_bytes: int = 96) -> dict[str, int]:
    """probe text -> first holdout line number (1-based)."""
    probes: dict[str, int] = {}
    for number, raw in enumerate(lines, 1):
        line = " ".join(MARKERS.sub(" ", raw).split())
        if len(line) < length:
            continue
        for i in range(per_line):
            start = round((len(line) - length) * i / max(per_line - 1, 1))
            end = start + length
            while len(line[start:end].encode("utf-8")) < min_bytes and end < len(line):
                end += 1
            probe = line[start:end]
            if len(probe.encode("utf-8")) >= min_bytes:
                probes.setdefault(probe, number)
    return probes


class SampledGrams:
    """Exact multi-pattern search by 16-byte grams sampled at 8-byte strides (see the module docstring)."""

    STRIDE, GRAM, BITS = 8, 16, 20
    MIN_PATTERN = GRAM + STRIDE - 1  # shortest pattern that always covers an aligned gram
    _A, _B = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)

    def __init__(self, patterns: list[bytes]):
        if min(map(len, patterns)) < self.MIN_PATTERN:
            raise LeakScanError(f"sampled-grams needs patterns of >= {self.MIN_PATTERN} bytes; use hyperscan")
        self.keys: dict[int, list[tuple[int, int]]] = {}
        grams = np.frombuffer(b"".join(p[o:o + self.GRAM] for p in patterns for o in range(self.STRIDE)), "<u8")
        for i, key in enumerate(self._mix(grams[0::2], grams[1::2]).tolist()):
            self.keys.setdefault(key, []).append(divmod(i, self.STRIDE))  # (pattern id, offset in the pattern)
        self.sorted_keys = np.array(sorted(self.keys), dtype=np.uint64)
        self.bitmap = np.zeros(1 << self.BITS, dtype=bool)
        self.bitmap[self.sorted_keys >> np.uint64(64 - self.BITS)] = True

    def _mix(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """A 64-bit key for 16 bytes: one wrapping multiply spreads the first word over the top bits (those index
        the bitmap); the second word is xor-ed in. Collisions only cost a byte comparison, never a miss."""
        return (first * self._A) ^ second

    def find(self, data: bytes, patterns: list[bytes]) -> list[tuple[int, int]]:
        words = np.frombuffer(data, "<u8", count=len(data) // 8)
        if len(words) < 2:
            return []
        top = words[:-1] * self._A  # the same key as _mix, computed in place: one temporary for the whole chunk
        top ^= words[1:]
        top >>= np.uint64(64 - self.BITS)
        candidates = np.flatnonzero(self.bitmap[top])
        keys = self._mix(words[candidates], words[candidates + 1])
        exact = np.isin(keys, self.sorted_keys)  # full 64-bit key matches only
        found = []
        for word, key in zip(candidates[exact].tolist(), keys[exact].tolist()):
            for pid, offset in self.keys[key]:
                start = word * self.STRIDE - offset
                pattern = patterns[pid]
                if start >= 0 and data[start:start + len(pattern)] == pattern:
                    found.append((pid, start + len(pattern)))
        return found


class _Matcher:
    """Multi-literal byte matcher reporting (pattern id, end offset) for every occurrence, overlaps included."""

    def __init__(self, patterns: list[bytes], engine: str | None = None):
        self.patterns = patterns
        self.engine = engine or self._best_engine(patterns)
        if self.engine == "sampled-grams":
            self.grams = SampledGrams(patterns)
        elif self.engine == "hyperscan":
            import hyperscan

            self.db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            self.db.compile(expressions=patterns, ids=list(range(len(patterns))),
                            elements=len(patterns), flags=[0] * len(patterns), literal=True)
        elif self.engine == "ahocorasick-rs":
            import ahocorasick_rs

            self.ac = ahocorasick_rs.BytesAhoCorasick(patterns)
        else:
            raise LeakScanError(f"unknown engine {self.engine!r}")

    @staticmethod
    def _best_engine(patterns: list[bytes]) -> str:
        if min(map(len, patterns)) >= SampledGrams.MIN_PATTERN:
            return "sampled-grams"
        try:
            import hyperscan  # noqa: F401

            return "hyperscan"
        except ImportError:
            return "ahocorasick-rs"

    def find(self, data: bytes) -> list[tuple[int, int]]:
        if self.engine == "sampled-grams":
            return self.grams.find(data, self.patterns)
        if self.engine == "hyperscan":
            found: list[tuple[int, int]] = []

            def on_match(pattern_id, start, end, flags, context):
                found.append((pattern_id, end))

            self.db.scan(data, match_event_handler=on_match)
            return found
        return [(pid, end) for pid, _, end in self.ac.find_matches_as_indexes(data, overlapping=True)]


def scan_bytes_chunks(chunks: Iterable[bytes], matcher: _Matcher) -> Counter:
    """Occurrences per pattern over a stream of chunks (overlap handled here; byte-exact confirmation)."""
    longest = max(len(p) for p in matcher.patterns)
    counts: Counter = Counter()
    tail, tail_start, seen = b"", 0, set()
    for chunk in chunks:
        data = tail + chunk
        for pid, end in matcher.find(data):
            pattern = matcher.patterns[pid]
            absolute = tail_start + end
            if data[end - len(pattern) : end] == pattern and (pid, absolute) not in seen:
                seen.add((pid, absolute))
                counts[pid] += 1
        keep = min(len(data), longest - 1)
        tail_start += len(data) - keep
        tail = data[len(data) - keep :]
        seen = {(pid, end) for pid, end in seen if end > tail_start}  # only matches that could repeat in the tail
    return counts


def _file_chunks(path: Path, chunk: int) -> Iterable[bytes]:
    with open(path, "rb") as f:
        while block := f.read(chunk):
            yield block


def self_test(matcher_factory, chunk: int = 8192) -> None:
    """A needle planted across chunk borders and at both ends must be found exactly 4 times; an absent one 0."""
    needle = "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。".encode()
    absent = "この文はどこにも埋め込まれていない検査用の文字列です。念のため長くしておく。".encode()
    filler = ("ただの詰め物の文章です。" * 2000).encode()
    data = needle + filler[: chunk - 10] + needle + filler + needle + filler[:777] + needle
    matcher = matcher_factory([needle, absent])
    counts = scan_bytes_chunks((data[i : i + chunk] for i in range(0, len(data), chunk)), matcher)
    if counts[0] != 4 or counts[1] != 0:
        raise LeakScanError(f"scanner self-test failed ({matcher.engine}): planted 4, found {counts[0]}; "
                            f"absent found {counts[1]}")


def scan_for_leaks(holdout: str | Path, corpora: list[str | Path], engine: str | None = None,
                   chunk: int = CHUNK, length: int = 48, per_line: int = 3, progress=None) -> dict:
    """Scan every corpus for holdout probes; returns the report (`leaked` true on any hit)."""
    holdout = Path(holdout)
    if not holdout.is_file():
        raise LeakScanError(f"{holdout}: holdout file not found")
    lines = holdout.read_text(encoding="utf-8").splitlines()
    probes = make_probes(lines, length, per_line)
    if not probes:
        raise LeakScanError(f"{holdout.name}: no holdout line is {length}+ chars long; nothing to probe")
    probe_list = list(probes)

    def factory(patterns):
        return _Matcher(patterns, engine)

    self_test(factory)
    plain = [p.encode("utf-8") for p in probe_list]
    escaped = [json.dumps(p, ensure_ascii=False)[1:-1].encode("utf-8") for p in probe_list]
    report = {"holdout": holdout.name, "holdout_lines": len(lines), "probe_chars": length, "probes": len(probes),
              "corpora": []}
    for corpus in map(Path, corpora):
        path = corpus / "documents.jsonl" if corpus.is_dir() else corpus
        if not path.is_file():
            raise LeakScanError(f"{corpus}: no such corpus file (or folder without documents.jsonl)")
        patterns, owner = list(plain), list(range(len(plain)))  # owner[pattern id] = probe index
        if path.suffix == ".jsonl":  # JSON-escaped text: also look for the escaped form of each probe
            for i, (e, p) in enumerate(zip(escaped, plain)):
                if e != p:
                    patterns.append(e)
                    owner.append(i)
        matcher = factory(patterns)
        start = time.perf_counter()
        counts = scan_bytes_chunks(_file_chunks(path, chunk), matcher)
        seconds = time.perf_counter() - start
        per_probe: Counter = Counter()
        for pid, n in counts.items():
            per_probe[owner[pid]] += n
        size = path.stat().st_size
        hits = {probe_list[i]: n for i, n in per_probe.items()}
        report["corpora"].append({
            "corpus": corpus.name, "bytes": size, "engine": matcher.engine, "seconds": round(seconds, 3),
            "mib_per_s": round(size / 2**20 / max(seconds, 1e-9), 1), "hit_probes": len(hits),
            "affected_holdout_lines": sorted({probes[p] for p in hits}),
            "examples": [{"probe": p, "count": n} for p, n in sorted(hits.items(), key=lambda kv: -kv[1])[:5]],
        })
        if progress:
            progress(report["corpora"][-1])
    report["leaked"] = any(c["hit_probes"] for c in report["corpora"])
    return report
