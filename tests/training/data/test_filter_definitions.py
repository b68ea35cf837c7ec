"""The corpus filters' fast forms against their definitions, computed here character by character (or window by
window) over generated text: the control-character removal, the Japanese share, the repetition check, the PII
masker's shortcuts; and the near-duplicate signature against what a MinHash signature is for, the Jaccard
similarity of two texts' 5-gram sets, computed here from the sets themselves."""

from __future__ import annotations

import random
import unicodedata
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hitoban.training.data import filters
from hitoban.training.data.filters import (
    PIIMasker,
    is_repetitive,
    japanese_ratio,
    without_controls,
)
from hitoban.training.data.near_duplicates import SAMPLE, signature

JAPANESE_PUNCTUATION = "々〆ー、。「」"
# every Unicode category, controls, format characters, surrogates and unassigned code points among them
ANY_CHARACTER = st.one_of(st.characters(categories=("Cc", "Cf", "Cs", "Co", "Cn")), st.characters(),
                          st.sampled_from("\n\t 　あア漢ー。"))


def is_japanese(ch: str) -> bool:
    return ("\u3040" <= ch <= "\u309f" or "\u30a0" <= ch <= "\u30ff" or "\u4e00" <= ch <= "\u9fff"
            or ch in JAPANESE_PUNCTUATION)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=ANY_CHARACTER, max_size=80), st.sampled_from(["", "\t", "\n\t"]))
def test_controls_are_removed_as_their_unicode_category_says(text, keep):
    expected = "".join(ch for ch in text if unicodedata.category(ch)[0] != "C" or ch in keep)
    assert without_controls(text, keep) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=ANY_CHARACTER, max_size=80))
def test_the_japanese_share_counts_each_japanese_character(text):
    assert japanese_ratio(text) == sum(map(is_japanese, text)) / max(len(text), 1)


def repeats_by_definition(text: str, window: int, limit: int) -> bool:
    """3LM step 5 as written: windows sampled every len // 2000 characters, one counted at a time."""
    if len(text) < 80:
        return False
    seen: Counter = Counter()
    for start in range(0, len(text) - window + 1, max(1, len(text) // 2000)):
        seen[text[start:start + window]] += 1
        if seen[text[start:start + window]] >= limit:
            return True
    return False


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="あいうアイ漢字。", min_size=1, max_size=30), min_size=1, max_size=12),
       st.lists(st.integers(0, 11), max_size=300), st.integers(2, 25), st.integers(2, 6))
def test_repetition_is_found_exactly_where_the_sampled_windows_repeat(phrases, order, window, limit):
    text = "".join(phrases[i % len(phrases)] for i in order)  # phrases repeated in a generated order
    assert is_repetitive(text, window, limit) == repeats_by_definition(text, window, limit)


def shingles(text: str) -> set[str]:
    sample = text[:SAMPLE]
    return {sample[i:i + 5] for i in range(max(1, len(sample) - 4))}


def estimate_errors(signature) -> list[float]:
    """For 60 pairs of texts whose 5-gram sets overlap from not at all to entirely, the share of equal hash values
    (a MinHash estimate) minus the Jaccard similarity of the two sets."""
    rng = random.Random(0)
    kana = [chr(c) for c in range(0x3041, 0x3094)]
    errors = []
    for pair in range(60):
        base = [rng.choice(kana) for _ in range(1500)]
        edited = base[:]
        for i in rng.sample(range(len(base)), int(len(base) * pair / 60 * 0.4)):
            edited[i] = rng.choice(kana)
        a, b = "".join(base), "".join(edited)
        jaccard = len(shingles(a) & shingles(b)) / len(shingles(a) | shingles(b))
        errors.append(float(np.mean(np.asarray(signature(a)) == np.asarray(signature(b)))) - jaccard)
    return errors


def estimates_jaccard(errors: list[float]) -> bool:
    """64 permutations: each estimate's spread is at most 1/16; over 60 pairs the mean error is within 0.03 (3x its
    spread) and no pair is off by more than 0.25 (4x)."""
    return abs(float(np.mean(errors))) < 0.03 and max(map(abs, errors)) < 0.25


def test_the_near_duplicate_signature_estimates_the_jaccard_similarity_of_5_grams():
    assert estimates_jaccard(estimate_errors(signature))


def test_control_a_signature_of_the_text_itself_is_no_estimate():
    """Negative control: 64 hash values that depend on the text but are no MinHash (each of 64 characters, hashed)
    fail the same check."""
    def not_minhash(text: str) -> list[int]:
        return [hash(text[i * 20:i * 20 + 3]) for i in range(64)]

    assert not estimates_jaccard(estimate_errors(not_minhash))


CONTACT_FRAGMENTS = ["03-1234-5678", "09012345678", "+81 90-1234-5678",  # hitoban: allow-secret (fake)
                     "０３－１２３４－５６７８",  # hitoban: allow-secret (fake)
                     "taro.yamada@gmail.com", "hanako＠mail.co.jp", "user@example.com",  # hitoban: allow-secret (fake)
                     "4111 1111 1111 1111", "٤١١١١١١١١١١١١١١١", "1", "０", "@", "＠", "-", " ", "(", ".", "\n",
                     "連絡は", "まで。", "ab", "電話"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(CONTACT_FRAGMENTS), max_size=14), st.booleans())
def test_the_maskers_shortcuts_change_nothing(fragments, salted):
    """The masker skips the e-mail pattern for a text with no at sign and the number patterns for one with no digit;
    the same masker with every pattern always run gives the same text, counts and sealed log."""
    text = "".join(fragments)
    salt = b"s" * 16 if salted else None
    quick = PIIMasker(salt=salt)
    masked = quick.mask(text)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(filters, "may_hold_email", lambda text: True)
        patch.setattr(filters, "may_hold_number", lambda text: True)
        full = PIIMasker(salt=salt)
        assert full.mask(text) == masked
    assert (full.counts, full.log) == (quick.counts, quick.log)
