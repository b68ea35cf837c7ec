"""The data verbs end to end: `hitoban corpus`, `tokenizer`, `shards` and `shards --verify`."""

from __future__ import annotations

from hitoban.cli import main
from hitoban.training.data.shards import load_index


def test_cli_corpus_tokenizer_shards_verify(tmp_path, corpus, capsys):
    lit = [str(p) for p in sorted((corpus / "literature").glob("0*.txt"))[:15]]
    assert main(["corpus", "--input", *lit, "--doc-per-file", "--name", "aozora-local", "--out",
                 str(tmp_path / "c")]) == 0
    assert main(["tokenizer", "--corpus", str(tmp_path / "c"), "--out", str(tmp_path / "tok"), "--vocab-size",
                 "4000"]) == 0
    assert main(["shards", "--corpus", str(tmp_path / "c"), "--tokenizer", str(tmp_path / "tok"), "--out",
                 str(tmp_path / "s"), "--context", "64", "--val-every", "5"]) == 0
    assert main(["shards", "--verify", str(tmp_path / "s"), "--tokenizer", str(tmp_path / "tok")]) == 0
    out = capsys.readouterr().out
    assert "shards OK" in out and "held-out chars/token" in out
    assert load_index(tmp_path / "s")["tokenizer"]["vocab_size"] == 4000
    assert main(["corpus", "--input", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "x")]) == 2
