"""training/data/near_duplicates.py against datasketch itself (installed for the tests: the product does not import
it, for its scipy): the same signatures as its MinHash with the "affine32" scheme, the same bands as its
MinHashLSH, and the same near-duplicate decisions over generated corpora of edited copies; and a threshold
datasketch refuses (one band) still decides, as an exact signature match."""

from __future__ import annotations

import random

import mmh3
import numpy as np
import pytest
from datasketch import MinHash, MinHashLSH
from datasketch.lsh import _optimal_param
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hitoban.training.data import near_duplicates
from hitoban.training.data.near_duplicates import PERMUTATIONS, SAMPLE, NearDuplicates, bands, signature

KANA = [chr(c) for c in range(0x3041, 0x3094)]
TEXT = st.text(alphabet=st.one_of(st.sampled_from(KANA[:12] + ["。", "漢", "字"]), st.characters()), max_size=2600)


def datasketch_signature(text: str) -> MinHash:
    """datasketch's own MinHash of the text's 5-grams (of its first 2,000 characters), each hashed by MurmurHash3."""
    sample = text[:SAMPLE]
    grams = {sample[i:i + 5] for i in range(max(1, len(sample) - 4))}
    minhash = MinHash(num_perm=PERMUTATIONS, seed=1, scheme="affine32", hashfunc=lambda value: value)
    minhash.update_batch([mmh3.hash(gram.encode("utf-8", "surrogatepass"), 0, signed=False) for gram in grams])
    return minhash


@settings(max_examples=150, deadline=None)
@given(TEXT)
@example("")  # one empty 5-gram: still a signature
@example("あいう\ud800えおかき")  # a lone surrogate: its 5-grams hashed as bytes (mmh3 crashed on the str)
def test_the_signature_is_datasketchs_minhash(text):
    ours = signature(text)
    assert ours.dtype == np.uint32 and ours.shape == (PERMUTATIONS,)
    assert np.array_equal(ours, datasketch_signature(text).hashvalues)


def test_a_lone_surrogate_gets_a_signature_and_valid_text_hashes_as_str():
    """mmh3 hashing a str that holds a lone surrogate crashed the whole process (a segfault, found by the test
    above in a fresh clone's run); such text's 5-grams are hashed as bytes, and valid text's signature is the one
    its str 5-grams give (so every corpus's decisions are unchanged)."""
    assert signature("吾輩は\ud800猫である").shape == (PERMUTATIONS,)
    text = "吾輩は猫である。名前はまだ無い。"
    grams = {text[i:i + 5] for i in range(len(text) - 4)}
    a, b = near_duplicates.permutations()
    by_str = near_duplicates._premix(np.array([mmh3.hash(g, 0, signed=False) for g in grams], dtype=np.uint32))
    assert np.array_equal(signature(text), (by_str[:, None] * a + b).min(axis=0))


@settings(max_examples=25, deadline=None)
@given(st.floats(0.0005, 1.0))
@example(0.85)  # the default
@example(0.5)
@example(1.0)
def test_the_bands_are_datasketchs_choice(threshold):
    assert bands(threshold) == _optimal_param(threshold, PERMUTATIONS, 0.5, 0.5)


def test_the_bands_datasketch_builds_with_are_the_same():
    for threshold in (0.3, 0.7, 0.85, 0.95):
        index = MinHashLSH(threshold=threshold, num_perm=PERMUTATIONS)
        assert bands(threshold) == (index.b, index.r)


def edited_corpus(seed: int, documents: int = 40) -> list[str]:
    """Texts and edited copies of them, from untouched to 30% of their characters replaced (each replacement
    changes up to five 5-grams): some near duplicates at any threshold, some at none."""
    rng = random.Random(seed)
    texts = []
    for _ in range(documents):
        if texts and rng.random() < 0.6:
            edited, share = list(rng.choice(texts)), rng.choice([0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.3])
            for i in rng.sample(range(len(edited)), int(len(edited) * share)):
                edited[i] = rng.choice(KANA)
            texts.append("".join(edited))
        else:
            texts.append("".join(rng.choice(KANA) for _ in range(rng.randint(5, 2500))))
    return texts


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from([0.3, 0.5, 0.7, 0.85, 0.9, 0.95]))
def test_the_decisions_are_datasketchs_lsh(seed, threshold):
    ours, theirs = NearDuplicates(threshold), MinHashLSH(threshold=threshold, num_perm=PERMUTATIONS)
    decided = []
    for key, text in enumerate(edited_corpus(seed)):
        minhash = datasketch_signature(text)
        near = bool(theirs.query(minhash))
        if not near:
            theirs.insert(key, minhash)
        decided.append(near)
        assert ours.seen_before(signature(text)) == near, (key, threshold)
    assert any(decided) or threshold > 0.9  # the generated corpora hold near duplicates to find


def test_one_band_is_an_exact_signature_match():
    """Thresholds above about 0.98 take one band of all 64 values (datasketch refuses it): a text and its copy are
    near duplicates, a text with one character in fifty replaced is not, and nothing is near an empty index."""
    assert bands(0.99) == (1, PERMUTATIONS)
    rng = random.Random(1)
    index, text = NearDuplicates(0.99), "".join(rng.choice(KANA) for _ in range(SAMPLE))
    assert not index.seen_before(signature(text))
    assert index.seen_before(signature(text))
    assert index.seen_before(signature(text + "あ" * 600))  # past the 2,000 characters a signature covers
    edited = "".join("ん" if i % 50 == 0 else ch for i, ch in enumerate(text))  # a 5-gram in ten changed
    assert not index.seen_before(signature(edited))  # Jaccard about 0.8: all 64 values equal with odds 0.8 ** 64


def test_control_a_different_band_split_decides_differently():
    """Negative control: the decision test's comparison can fail. Rows of one fewer per band (datasketch's choice
    at 0.5 is 14 x 4) call different pairs near duplicates over the same corpora."""
    differs = False
    for seed in range(5):
        ours, theirs = NearDuplicates(0.5), MinHashLSH(threshold=0.5, num_perm=PERMUTATIONS)
        ours.rows = ours.rows - 1
        for key, text in enumerate(edited_corpus(seed)):
            minhash = datasketch_signature(text)
            near = bool(theirs.query(minhash))
            if not near:
                theirs.insert(key, minhash)
            differs |= ours.seen_before(signature(text)) != near
    assert differs


@pytest.mark.parametrize("threshold", [0, -0.1, 1.5])
def test_refuses_a_threshold_outside_0_1(threshold):
    with pytest.raises(ValueError, match=f"in \\(0, 1\\], not {threshold}"):
        NearDuplicates(threshold)


def test_the_module_imports_neither_datasketch_nor_scipy():
    import subprocess
    import sys

    probe = ("import sys, hitoban.training.data.near_duplicates as n; n.bands(0.85); n.signature('あいうえおか'); "
             "print(sorted({'scipy', 'datasketch'} & set(sys.modules)))")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"
    assert near_duplicates.GAUSS_POINTS * 2 - 1 >= PERMUTATIONS  # Gauss-Legendre exact to the integrands' degree
