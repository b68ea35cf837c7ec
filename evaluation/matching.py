"""Exact multi-pattern byte search for the leak scan: every occurrence of every pattern, in chunks that overlap by
(longest pattern - 1) bytes, each confirmed byte for byte and counted once per offset.

Engine: `sampled-grams` (default, NumPy). Any occurrence of a pattern of >= 23 bytes covers one 16-byte gram that
starts on an 8-byte boundary of the text, at offset 0..7 of the pattern; the 8 possible grams of every pattern are
hashed into a 1 MiB bitmap, so the scan is a few vectorised passes over len/8 words, and only exact 64-bit key
matches reach the byte-for-byte check. `hyperscan` and `ahocorasick-rs` remain as --engine options.
Lazy imports: hyperscan and ahocorasick-rs load only when chosen with --engine."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np

from hitoban.errors import InputError

MAX_POSITIONS = 200_000  # per whole-turn pattern: a phrase more common than this is useless as evidence


class LeakScanError(InputError):
    """Bad input for the scan (missing or empty holdout/corpus) or a failed self-test."""


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


class Matcher:
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


def scan_bytes_chunks(chunks: Iterable[bytes], matcher: Matcher, track: set[int] = frozenset()
                      ) -> tuple[Counter, dict[int, list[int]]]:
    """Occurrences per pattern over a stream of chunks (overlap handled here; byte-exact confirmation), and the
    absolute end offsets of the patterns in `track`."""
    longest = max(len(p) for p in matcher.patterns)
    counts: Counter = Counter()
    positions: dict[int, list[int]] = {pid: [] for pid in track}
    tail, tail_start, seen = b"", 0, set()
    for chunk in chunks:
        data = tail + chunk
        for pid, end in matcher.find(data):
            pattern = matcher.patterns[pid]
            absolute = tail_start + end
            if data[end - len(pattern) : end] == pattern and (pid, absolute) not in seen:
                seen.add((pid, absolute))
                counts[pid] += 1
                if pid in positions and len(positions[pid]) < MAX_POSITIONS:
                    positions[pid].append(absolute)
        keep = min(len(data), longest - 1)
        tail_start += len(data) - keep
        tail = data[len(data) - keep :]
        seen = {(pid, end) for pid, end in seen if end > tail_start}  # only matches that could repeat in the tail
    return counts, positions
