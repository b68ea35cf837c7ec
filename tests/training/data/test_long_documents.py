"""Long documents kept, not cut (issue 37): over `--max-chars` a document is split at sentence ends into pieces that
each pass the filters; truncation stays available (3LM's rule). Every character read is accounted for."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from hitoban.training.data.corpus import build_corpus, local_source
from hitoban.training.data.filters import DocumentFilter, FilterSettings, split_long

SENTENCES = st.lists(st.text(alphabet="吾輩は猫である名前まだ無いどこで生れたかとんと見当がつかぬ 「」", min_size=1,
                             max_size=60).map(lambda s: s + st_end(s)), min_size=1, max_size=80)


def st_end(sentence: str) -> str:
    return "。」" if sentence.count("「") > sentence.count("」") else "。"


@given(SENTENCES, st.integers(20, 400))
def test_split_long_cuts_at_sentence_ends_into_pieces_no_longer_than_asked(sentences, max_chars):
    text = "".join(sentences)
    pieces = split_long(text, max_chars)
    assert "".join(pieces) == text  # nothing lost, nothing added
    assert all(0 < len(p) <= max_chars for p in pieces)
    if len(text) <= max_chars:
        assert pieces == [text]
    # a cut falls after a sentence end whenever one lies in the piece's allowed span
    for piece in pieces[:-1]:
        if any(ch == "。" for ch in piece):
            assert piece.rstrip("」 ").endswith("。") or len(piece) == max_chars or " " in piece


LETTERS = st.text(alphabet="あいうえおかきくけこ漢字。！？「」 abc\n\x07", min_size=0, max_size=3000)


@settings(max_examples=60, deadline=None)
@given(st.lists(LETTERS, max_size=12), st.sampled_from(["split", "truncate"]), st.integers(50, 900))
def test_every_character_read_is_kept_cleaned_away_or_dropped_by_a_reason(documents, mode, max_chars):
    doc_filter = DocumentFilter(FilterSettings(min_chars=30, max_chars=max_chars, long_docs=mode,
                                               near_dup_threshold=None))
    kept = [piece for raw in documents for piece in doc_filter.pieces(raw)]
    chars = doc_filter.chars
    assert chars["read"] == sum(map(len, documents))
    dropped = sum(v for k, v in chars.items() if k not in ("read", "kept", "cleaned_away"))
    assert chars["read"] == chars["kept"] + chars["cleaned_away"] + dropped
    assert chars["kept"] == sum(map(len, kept)) and all(len(p) <= max_chars for p in kept)


def test_a_corpus_of_novels_keeps_what_passes_and_the_manifest_says_what_was_dropped(corpus, tmp_path):
    """The test corpus's Aozora works, one document per file, at 3LM's --max-chars 20000: split keeps >= 99% of
    the characters that pass the filters; truncation (the control, 3LM's rule) loses much of each long work."""
    works = sorted(str(p) for p in (corpus / "literature").glob("0*.txt"))
    lengths = {}
    for mode in ("split", "truncate"):
        manifest = build_corpus([local_source(works, name="literature", doc_per_file=True)], tmp_path / mode,
                                settings=FilterSettings(long_docs=mode), progress=False)
        account = manifest["characters"]
        dropped = sum(account["dropped"].values())
        assert account["read"] == account["kept"] + account["cleaned_away"] + dropped
        texts = [json.loads(line)["text"] for line in (tmp_path / mode / "documents.jsonl").open(encoding="utf-8")]
        assert all(len(t) <= 20_000 for t in texts)
        lengths[mode] = (account, manifest["filters"], sum(map(len, texts)))
    split, split_filters, _ = lengths["split"]
    cut, cut_filters, _ = lengths["truncate"]
    assert split_filters["long_documents"] > 0 and split_filters["split_pieces"] > split_filters["long_documents"]
    assert split["kept_of_passing"] >= 0.99 and "truncated" not in split["dropped"]
    assert cut["dropped"]["truncated"] > 0 and cut["kept_of_passing"] < 0.99  # the control fails the bar
    assert split["kept"] > cut["kept"] + cut["dropped"]["truncated"] * 0.9
