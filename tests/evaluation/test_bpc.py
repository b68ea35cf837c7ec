"""Bits per character (evaluation/bpc.py, 3LM's definition), computed independently by hand, per domain and on
shards."""

from __future__ import annotations

import json
import math
import shutil
import warnings

import numpy as np
import pytest
import torch
from evaluation_helpers import FILLER

from hitoban.cli import main
from hitoban.errors import InputError
from hitoban.evaluation.bpc import BpcError, bits_per_char, cross_domain, write_outputs
from hitoban.modeling.loading import load_model_and_tokenizer


def test_bits_per_char_by_hand_on_a_short_text(tiny_model_dir):
    """The definition written out token by token, independently of the batched windows: token i is predicted from
    <|end|> + the tokens before it in its window of 4; marker tokens are not scored; the characters are counted by
    hand: 吾輩は猫である。 (8) + 名前はまだ無い。 (8) = 16, the markers are not characters of the text."""
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    text = "吾輩は猫である。<|user|>名前はまだ無い。<|end|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    markers = set(tok.convert_tokens_to_ids(["<|user|>", "<|end|>"]))
    sequence = [tok.convert_tokens_to_ids("<|end|>")] + ids
    nats = 0.0
    with torch.no_grad():
        for i, target in enumerate(ids):
            window_start = (i // 4) * 4
            logits = model(torch.tensor([sequence[window_start : i + 1]])).logits[0, -1].double()
            if target not in markers:
                nats -= torch.log_softmax(logits, -1)[target].item()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a short text is flagged; the value is still defined
        result = bits_per_char(model, tok, text, "hand", window=4)
        whole = bits_per_char(model, tok, text, "hand", window=256)
    assert result["chars"] == 16 and result["marker_tokens"] == 2 and result["tokens"] == len(ids)
    assert result["windows"] == -(-len(ids) // 4) and len(ids) % 4  # a shorter last window is scored too
    assert abs(result["bits_per_char"] - nats / math.log(2) / 16) < 1e-6
    # every token is scored once whatever the window: a window longer than the text gives the same definition
    # (up to the context each token sees), and the characters are the same 16
    assert whole["chars"] == 16 and whole["scored_tokens"] == result["scored_tokens"]


def test_bits_per_char_on_a_long_text_is_near_uniform_for_a_random_model(tiny_model_dir, corpus):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    text = (corpus / "3lm-eval" / "holdout_clean.txt").read_text(encoding="utf-8")[:20_000]
    result = bits_per_char(model, tok, text, "dialogue")
    assert result["windows"] >= 8 and "warning" not in result
    assert result["chars"] == len(text) - sum(text.count(m) * len(m) for m in ("<|user|>", "<|assistant|>", "<|end|>"))
    uniform = math.log2(len(tok)) * result["scored_tokens"] / result["chars"]  # a random model is near uniform
    assert 0.8 * uniform < result["bits_per_char"] < 1.3 * uniform


def test_short_and_missing_domains_are_reported_not_averaged(tiny_model_dir, tmp_path):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    with pytest.warns(UserWarning, match="too short for a stable estimate"):
        short = bits_per_char(model, tok, FILLER * 12, "short")
    assert short["windows"] < 8 and "warning" in short
    with pytest.raises(BpcError, match="empty"):
        bits_per_char(model, tok, "  \n", "blank")
    with pytest.raises(BpcError, match="only chat markers"):
        bits_per_char(model, tok, "<|user|><|end|>", "markers")
    with pytest.raises(BpcError, match="not found"):
        cross_domain([tiny_model_dir], {"web": tmp_path / "nope.txt"})
    no_tok = tmp_path / "model-only"
    model.save_pretrained(no_tok)
    with pytest.raises(InputError, match="no tokenizer.json"):
        load_model_and_tokenizer(no_tok)


def test_shard_domains_are_whole_documents(tiny_shards):
    from hitoban.training.data.reader import ShardReader

    reader = ShardReader(tiny_shards, "val")
    for cap in (50, 3000):
        for documents in reader.domain_documents(cap).values():
            assert all(doc[-1] == reader.end_id and (doc[:-1] != reader.end_id).all() for doc in documents)
            assert len(documents) == 1 or sum(map(len, documents)) <= cap


def test_cross_domain_table_json_markdown_png(tiny_model_dir, corpus, tmp_path, tiny_shards, pretrained):
    literature = sorted((corpus / "literature").glob("0*.txt"))[-1]
    assert main(["eval", "bpc", str(tiny_model_dir), "--domain", f"literature={literature}", "--domain",
                 f"dialogue={corpus / '3lm-eval' / 'holdout_clean.txt'}", "--max-chars", "30000", "--out",
                 str(tmp_path / "bpc.json")]) == 0
    result = json.loads((tmp_path / "bpc.json").read_text())
    assert {r["domain"] for r in result["records"]} == {"literature", "dialogue"}
    table = (tmp_path / "bpc.md").read_text()
    assert "| model | literature | dialogue |" in table
    assert f"{result['records'][0]['bits_per_char']:.3f}" in table
    assert (tmp_path / "bpc.png").stat().st_size > 5000
    assert str(tmp_path) not in (tmp_path / "bpc.json").read_text()
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    from hitoban.evaluation.bpc import shard_domain_bpc

    rows = shard_domain_bpc(model, tok, tiny_shards, max_tokens=5000)
    assert rows and rows[0]["domain"] == "literature" and np.isfinite(rows[0]["bits_per_char"])
    write_outputs({"records": [{"model": "m", **rows[0]}]}, tmp_path / "val.json")
    assert main(["eval", "bpc", str(pretrained), "--shards", str(tiny_shards), "--out",
                 str(tmp_path / "val-cli.json")]) == 0  # a model trained on these shards, with their tokenizer
    records = json.loads((tmp_path / "val-cli.json").read_text())["records"]
    assert [r["domain"] for r in records] == ["val:literature"] and np.isfinite(records[0]["bits_per_char"])


def test_bits_per_char_refuses_shards_of_another_tokenizer(tiny_model_dir, tiny_shards, pretrained, tmp_path, capsys):
    """Issue 25: shards encoded with another tokenizer gave exit 0 and a bits/char table computed on ids that mean
    other pieces. The index records its tokenizer's sha256; a model whose tokenizer differs is refused."""
    assert main(["eval", "bpc", str(tiny_model_dir), "--shards", str(tiny_shards), "--out",
                 str(tmp_path / "x.json")]) == 2
    assert "encoded with another tokenizer" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
    # control: the same tokenizer saved again (other formatting, as the Trainer re-saves it after SFT) is accepted
    resaved = tmp_path / "resaved"
    shutil.copytree(pretrained, resaved)
    data = json.loads((resaved / "tokenizer.json").read_text(encoding="utf-8"))
    (resaved / "tokenizer.json").write_text(json.dumps(data, indent=4, ensure_ascii=True), encoding="utf-8")
    assert main(["eval", "bpc", str(resaved), "--shards", str(tiny_shards), "--out", str(tmp_path / "ok.json")]) == 0
