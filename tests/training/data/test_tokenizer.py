"""Tokenizer: SentencePiece-trained, tokenizers-run, byte fallback, chat template with assistant mask
(docs/design.md §3)."""

from __future__ import annotations

import json

import pytest
import sentencepiece as spm
from hypothesis import given, settings
from hypothesis import strategies as st

from hitoban.training.data.tokenizer import (
    SPECIAL_TOKENS,
    chars_per_token,
    load_tokenizer,
    sentence_pieces,
    train_tokenizer_from_texts,
)


def held_out_lines(corpus, limit=4000):
    """Lines from works not used to train the fixture tokenizer, plus web prose it never saw."""
    lines = []
    for path in sorted((corpus / "literature").glob("0*.txt"))[-30:] + sorted((corpus / "web-or-wiki").glob("*.txt")):
        lines += [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()][:300]
    return lines[:limit]


def test_ids_equal_sentencepiece_on_held_out_text(tokenizer, tokenizer_dir, corpus):
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_dir / "sentencepiece.model"))
    lines = held_out_lines(corpus)
    assert len(lines) > 2000
    encoded = tokenizer(lines, add_special_tokens=False)["input_ids"]
    mismatched = [line for line, ids in zip(lines, encoded) if ids != sp.encode(line)]
    assert mismatched == []


def test_special_tokens_are_single_ids_in_3lm_order(tokenizer):
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert tokenizer.eos_token == tokenizer.pad_token == "<|end|>"
    ids = tokenizer("<|user|>こんにちは<|assistant|>やあ<|end|>", add_special_tokens=False)["input_ids"]
    assert ids[0] == 1 and ids[-1] == 3 and 2 in ids


def test_no_normalisation_fullwidth_stays_fullwidth(tokenizer):
    text = "本当？　ＡＢＣ！ ｶﾀｶﾅ  two  spaces"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_unseen_characters_use_byte_fallback_not_unk(tokenizer):
    text = "絵文字😀と𠮷野家とÆøå"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_round_trip_for_arbitrary_unicode(tokenizer, text):
    # Two documented exceptions (training/data/tokenizer.py): U+2581 "▁" (SentencePiece's space marker) and literal
    # byte-piece text like "<0x41>"; test_known_exceptions_are_shared_with_sentencepiece pins them down.
    if "<0x" in text or "▁" in text:
        return
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_known_exceptions_are_shared_with_sentencepiece(tokenizer, tokenizer_dir):
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_dir / "sentencepiece.model"))
    assert tokenizer.decode(tokenizer("a▁b", add_special_tokens=False)["input_ids"]) == sp.decode(sp.encode("a▁b"))
    assert tokenizer.decode(tokenizer("<0x41>", add_special_tokens=False)["input_ids"]) == "A"


def test_chat_template_masks_exactly_assistant_content_and_end(tokenizer):
    messages = [{"role": "user", "content": "今日は寒いね"}, {"role": "assistant", "content": "本当に寒いです"},
                {"role": "user", "content": "何を飲む？"}, {"role": "assistant", "content": "お茶にします"}]
    enc = tokenizer.apply_chat_template(messages, return_assistant_tokens_mask=True, return_dict=True)
    ids, mask = enc["input_ids"], enc["assistant_masks"]
    assert tokenizer.decode(ids) == ("<|user|>今日は寒いね<|assistant|>本当に寒いです<|end|>"
                                     "<|user|>何を飲む？<|assistant|>お茶にします<|end|>")
    counted = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert counted == "本当に寒いです<|end|>お茶にします<|end|>"
    prompt = tokenizer.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=False)
    assert prompt == "<|user|>今日は寒いね<|assistant|>"


def test_chat_template_rejects_unknown_roles(tokenizer):
    with pytest.raises(Exception, match="roles user and assistant"):
        tokenizer.apply_chat_template([{"role": "system", "content": "x"}], tokenize=False)


def test_sentence_pieces_follow_the_3lm_rule():
    text = "短い。" * 100 + "\n" + "長" * 7000
    pieces = list(sentence_pieces(text))
    assert all(len(p.encode()) >= 200 for p in pieces[:-4])
    assert all(len(p.encode()) <= 6000 for p in pieces)
    assert "".join(pieces).replace(" ", "") == text.replace("\n", "")


def test_saved_folder_loads_and_reports_chars_per_token(tokenizer_dir, corpus):
    tok = load_tokenizer(tokenizer_dir)
    meta = json.loads((tokenizer_dir / "tokenizer_meta.json").read_text())
    assert meta["vocab_size"] == len(tok) == 4000
    assert (tokenizer_dir / "chat_template.jinja").exists()
    cpt = chars_per_token(tok, held_out_lines(corpus, 500))
    assert 1.2 < cpt < 4.0


def test_too_small_corpus_gives_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="vocab"):
        train_tokenizer_from_texts(["短い文章です。"] * 3, tmp_path / "tok", vocab_size=8000)
    assert not (tmp_path / "tok").exists()


def test_empty_corpus_gives_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="empty"):
        train_tokenizer_from_texts(["", "   "], tmp_path / "tok", vocab_size=500)
    assert not (tmp_path / "tok").exists()
