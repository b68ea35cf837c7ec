"""The corpus filters and PII masks (training/data/filters.py): each filter rejects for its reason, boilerplate and
control characters go, real contacts are masked and dates, prices and codes are not."""

from __future__ import annotations

from data_helpers import JA, japanese_doc
from hypothesis import given, settings
from hypothesis import strategies as st

from hitoban.training.data.filters import DocumentFilter, FilterSettings, PIIMasker, clean


def test_each_filter_rejects_for_its_reason():
    f = DocumentFilter(FilterSettings())
    assert f.apply("404 Not Found " + JA * 5) is None
    assert f.apply(JA[:50]) is None
    assert f.apply("This is an English page. " * 20) is None
    assert f.apply("同じ文章の繰り返しです。" * 40) is None
    first = japanese_doc(1, 1500)  # 5-gram Jaccard with `edited` below: 0.98
    assert f.apply(first) == first
    assert f.apply(first) is None  # exact duplicate
    near = first[:200] + "違う" + first[202:]
    assert f.apply(near) is None  # same first 200 chars
    edited = "冒頭を変えた" + first[6:-10] + "末尾も違う。"
    assert f.apply(edited) is None  # near-duplicate via MinHash
    assert dict(f.rejected) == {"bad_page": 1, "too_short": 1, "low_japanese_ratio": 1, "repetition": 1,
                                "duplicate": 2, "near_duplicate": 1}


def test_near_duplicate_detection_can_be_turned_off_and_long_documents_truncate():
    f = DocumentFilter(FilterSettings(near_dup_threshold=None, max_chars=300, long_docs="truncate"))  # 3LM's rule
    first = japanese_doc(2, 800)
    assert len(f.apply(first)) == 300 and f.truncated == 1
    assert f.apply("冒頭を変えた" + first[6:]) is not None


def test_boilerplate_lines_and_control_characters_are_removed():
    f = DocumentFilter(FilterSettings(min_chars=10, near_dup_threshold=None))
    text = f.apply("ホーム\nこのサイトはクッキーを使用しています\n" + JA + "\x07\nAll Rights Reserved.\n続きを読む")
    assert text == JA


def test_pii_masking_masks_real_contacts_and_counts_examples():
    masker = PIIMasker()
    text = ("連絡は taro.yamada@gmail.com か 03-1234-5678、携帯 09012345678、"  # hitoban: allow-secret (fake)
            "+81 90-1234-5678 まで。例: user@example.com。カード 4111 1111 1111 1111。")
    masked = masker.mask(text)
    fakes = ("taro.yamada@gmail.com",  # hitoban: allow-secret (fake)
             "03-1234-5678", "09012345678", "90-1234-5678", "4111 1111 1111 1111")
    for secret in fakes:
        assert secret not in masked
    assert "user@example.com" in masked
    assert masker.counts == {"email": 1, "phone": 3, "card": 1, "email_example_kept": 1}


def test_pii_masking_leaves_dates_prices_and_codes_alone():
    text = "2024-11-29 に 1,000円 で購入。ISBN 978-4-00-310101-8、郵便番号 100-0001、第12345678号。"
    masker = PIIMasker()
    assert masker.mask(text) == text and not masker.counts


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.one_of(st.characters(categories=("Cs",)), st.characters()), max_size=60))
def test_cleaning_leaves_only_text_a_utf8_corpus_can_hold(text):
    """A JSON line may carry a lone surrogate (an escaped \\ud800); the corpus is UTF-8 and the shards' encoder refuses
    one (test_shards.py's generator leaves them out for that reason): the cleaning drops every surrogate."""
    clean(text, FilterSettings()).encode("utf-8")
