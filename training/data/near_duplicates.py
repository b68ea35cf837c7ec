"""Near-duplicate detection for the corpus filters: MinHash signatures of a text's character 5-grams, and an LSH
index over them that says whether a signature is near one seen before.

The same signatures, bands and decisions as datasketch 2's `MinHash` (its "affine32" scheme) and `MinHashLSH`,
held to datasketch itself by tests/training/data/test_near_duplicates.py, without importing it: datasketch's
package imports scipy at module level (for the integral that picks the bands), half a second of CPU in the one
process that writes a corpus, before any worker can start: most of the serial start-up of a build on 2 workers
(docs/benchmarks.md, data preparation). The integrals are of polynomials of degree at most 64, which numpy's
Gauss-Legendre rule integrates exactly. One band is served too (thresholds above about 0.98: an exact signature
match), where datasketch refuses it, so every threshold the corpus verb accepts builds a corpus.

numpy (the signatures' arithmetic) and mmh3 (the 5-grams' hash) load when this module does: only the filters'
near-duplicate step imports it."""

from __future__ import annotations

import functools

import mmh3
import numpy as np

PERMUTATIONS = 64  # hash values per signature
SEED = 1  # of the permutations (numpy's legacy RandomState, as datasketch draws them)
SAMPLE = 2000  # characters of a text that its signature covers: a text's start tells a re-post
SHINGLE = 5  # characters per n-gram
SHINGLE_HASH_SEED = 0  # MurmurHash3's seed for the 5-grams
GAUSS_POINTS = 40  # exact for polynomials of degree up to 79: the bands' integrands have degree b x r <= 64
_FMIX32 = tuple(np.uint32(c) for c in (16, 0x85EBCA6B, 13, 0xC2B2AE35, 16))  # MurmurHash3's finaliser


@functools.cache
def permutations(count: int = PERMUTATIONS, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """The affine maps h -> a h + b (mod 2^32, `a` odd: a bijection) of datasketch's "affine32" scheme, drawn as it
    draws them: made once per process, not once per document."""
    draw = np.random.RandomState(seed)
    a = draw.randint(0, 1 << 31, count, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = draw.randint(0, 1 << 32, count, dtype=np.uint32)
    return a, b


def _premix(hashes: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finaliser, a bijection that spreads the input hashes before the affine maps."""
    s1, m1, s2, m2, s3 = _FMIX32
    hashes = (hashes ^ (hashes >> s1)) * m1
    hashes = (hashes ^ (hashes >> s2)) * m2
    return hashes ^ (hashes >> s3)


def signature(text: str) -> np.ndarray:
    """The MinHash signature (64 uint32 values) of the set of 5-grams of `text`'s first 2,000 characters: a pure
    function of the text, computed in any process. Each 5-gram is hashed by MurmurHash3 (32 bits), a third of the
    time of SHA-1 (datasketch's default)."""
    sample = text[:SAMPLE]
    grams = {sample[i : i + SHINGLE] for i in range(max(1, len(sample) - SHINGLE + 1))}
    try:
        sample.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: mmh3 crashes the process on it (a segfault), so hash the bytes
        grams = {gram.encode("utf-8", "surrogatepass") for gram in grams}  # (valid text hashes as before)
    hashes = np.array([mmh3.hash(gram, SHINGLE_HASH_SEED, signed=False) for gram in grams], dtype=np.uint32)
    a, b = permutations()
    return (_premix(hashes)[:, None] * a + b).min(axis=0)


def _integrals(polynomials: np.ndarray, low: float, high: float) -> np.ndarray:
    """Each row of `polynomials` (values at `_nodes(low, high)`) integrated over [low, high]."""
    return (high - low) / 2 * (polynomials @ np.polynomial.legendre.leggauss(GAUSS_POINTS)[1])


def _nodes(low: float, high: float) -> np.ndarray:
    return (high - low) / 2 * np.polynomial.legendre.leggauss(GAUSS_POINTS)[0] + (high + low) / 2


@functools.cache
def bands(threshold: float, count: int = PERMUTATIONS) -> tuple[int, int]:
    """(bands, rows per band) for a Jaccard `threshold` and a signature of `count` values: the split that makes the
    mean of the false-positive and false-negative probabilities (integrated below and above the threshold) least,
    the first such in (bands, rows) order, as datasketch's MinHashLSH chooses with its default weights. Two texts
    are near duplicates when any band of their signatures is equal."""
    splits = np.array([(b, r) for b in range(1, count + 1) for r in range(1, count // b + 1)], float)
    b, r = splits[:, :1], splits[:, 1:]
    below, above = _nodes(0.0, threshold), _nodes(threshold, 1.0)
    false_positive = _integrals(1 - (1 - below**r) ** b, 0.0, threshold)
    false_negative = _integrals(1 - (1 - (1 - above**r) ** b), threshold, 1.0)
    best = int(np.argmin(false_positive * 0.5 + false_negative * 0.5))  # the first of equals, as a strict < keeps
    return int(splits[best, 0]), int(splits[best, 1])


class NearDuplicates:
    """The signatures kept so far, by band: a new one whose band equals a kept one's in any band is a near
    duplicate (its Jaccard similarity to a kept text likely at or above the threshold)."""

    def __init__(self, threshold: float):
        if not 0 < threshold <= 1:
            raise ValueError(f"a near-duplicate threshold is a Jaccard similarity in (0, 1], not {threshold}")
        self.bands, self.rows = bands(threshold)
        self._kept: list[set[bytes]] = [set() for _ in range(self.bands)]

    def seen_before(self, hashes: np.ndarray) -> bool:
        """Whether a signature (`signature`) is near one seen before; if not, it is remembered."""
        keys = [hashes[i * self.rows : (i + 1) * self.rows].tobytes() for i in range(self.bands)]
        if any(key in kept for key, kept in zip(keys, self._kept)):
            return True
        for key, kept in zip(keys, self._kept):
            kept.add(key)
        return False


__all__ = ["NearDuplicates", "PERMUTATIONS", "SAMPLE", "bands", "permutations", "signature"]
