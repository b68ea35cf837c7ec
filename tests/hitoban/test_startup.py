"""Verbs that need no model start without torch or transformers: each runs as the installed `hitoban` script on a
small input under `python -X importtime`, whose log names every module the process imported. Start-up seconds are
measured by benchmarks/bench_startup.py, not asserted here."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HEAVY = ("torch", "transformers", "accelerate", "datasets", "gradio", "matplotlib")
LINE = ("吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。何でも薄暗いじめじめした所で"
        "ニャーニャー泣いていた事だけは記憶している。")


def imported(importtime_log: str) -> set[str]:
    """Top-level names of every module a `-X importtime` log shows imported."""
    return {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in importtime_log.splitlines()
            if line.startswith("import time:")}


def run_verb(argv: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, set[str]]:
    script = Path(sys.executable).parent / "hitoban"
    assert script.exists(), f"no console script at {script}: is the package installed (pip install -e .)?"
    proc = subprocess.run([sys.executable, "-X", "importtime", str(script), *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    modules = imported(proc.stderr)
    assert "hitoban" in modules, proc.stderr[-3000:]  # the log is there: an empty one would pass anything
    return proc, modules


def write_shards(folder: Path, vocab: int = 300, end_id: int = 3) -> None:
    """A valid shard folder by hand (what `hitoban shards` writes, without its tokenizer): train and val shards of
    uint16 documents, each ending with <|end|>."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    shards = []
    for split, docs in (("train", 12), ("val", 3)):
        ids = np.concatenate([np.append(rng.integers(4, vocab, size=int(rng.integers(5, 40))), end_id)
                              for _ in range(docs)]).astype("<u2")
        name = f"{split}_000.bin"
        ids.tofile(folder / name)
        np.zeros(docs, dtype=np.uint8).tofile(folder / f"{split}_000.domains.u8")
        shards.append({"name": name, "split": split, "tokens": len(ids), "docs": docs,
                       "sha256": hashlib.sha256(ids.tobytes()).hexdigest(), "domains_file": f"{split}_000.domains.u8",
                       "domains": {"literature": len(ids)}})
    splits = {s: {"tokens": sum(x["tokens"] for x in shards if x["split"] == s),
                  "docs": sum(x["docs"] for x in shards if x["split"] == s),
                  "shards": [x["name"] for x in shards if x["split"] == s]} for s in ("train", "val", "test")}
    (folder / "shards_index.json").write_text(json.dumps({
        "format": "hitoban-shards/1 (zxell layout)", "dtype": "uint16", "domains": ["literature"],
        "tokenizer": {"name": "tok", "sha256": "0" * 64, "vocab_size": vocab, "end_id": end_id},
        "splits": splits, "shards": shards}))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_shards) -> Path:
    """Small inputs for every verb: a holdout and a text that contains one of its lines, a folder with a (fake)
    token, a heartbeat, shards, a corpus and its tokenizer, and a saved tiny model with a PII result for its
    weights."""
    from hitoban import HitobanConfig, HitobanForCausalLM
    from hitoban.provenance import weights_sha256

    root = tmp_path_factory.mktemp("startup")
    (root / "holdout.txt").write_text(LINE + "\n", encoding="utf-8")
    (root / "text.txt").write_text("前置きの文章です。\n" * 2000 + LINE + "\n" + "後書きの文章です。\n" * 2000,
                                   encoding="utf-8")
    (root / "project").mkdir()
    (root / "project" / "settings.py").write_text(f'TOKEN = "{"hf_" + "Q7x" * 10}"\n')  # built here: not in git
    (root / "run").mkdir()
    (root / "run" / "heartbeat.json").write_text(json.dumps(
        {"step": 50, "total_steps": 100, "tokens_seen": 51200, "token_budget": 102400, "train_loss": 3.2,
         "best_val": 3.4, "lr": 1e-3, "tok_per_sec": 12000, "elapsed_hours": 0.1, "resumes": 0, "eta_hours": 0.1,
         "updated_at": time.time(), "finished": False}))
    write_shards(root / "shards")
    for made in ("corpus", "tok"):  # what tiny_shards was built from
        shutil.copytree(tiny_shards.parent / made, root / made)
    HitobanForCausalLM(HitobanConfig.from_preset("tiny", vocab_size=300)).save_pretrained(root / "model")
    (root / "model" / "pii.json").write_text(json.dumps(
        {"kind": "pii-probe", "tried": 60, "exact": 0, "partial": 0, "weights_sha256": weights_sha256(root / "model")}))
    return root


# (argv, expected exit code, expected in stdout); card runs before upload, which needs the card it writes
VERBS = {
    "leaks": (["leaks", "--holdout", "holdout.txt", "--corpus", "text.txt"], 1, "LEAKED"),
    "secrets": (["secrets", "project"], 1, "hf-token"),
    "watch": (["watch", "run", "--once"], 0, "step 50/100"),
    "shards --verify": (["shards", "--verify", "shards"], 0, "shards OK: 2 files"),
    # encoding a corpus needs tokenizers, not transformers (whose import loads torch: ~4 s of start-up)
    "shards": (["shards", "--corpus", "corpus", "--tokenizer", "tok", "--out", "built", "--context", "64"], 0,
               "verified) in"),
    "card": (["card", "model", "--repo", "someone/tiny"], 0, "model card -> model/README.md"),
    # a folder saved without hitoban's lineage: the gates run (hashing every file, no torch) and refuse it
    "upload --dry-run": (["upload", "model", "--repo", "someone/tiny", "--dry-run"], 1, "REFUSED: no lineage.json"),
    "federate keys": (["federate", "keys", "--out", "keys", "--machine", "m1"], 0, '"m1"'),
}


@pytest.mark.parametrize("verb", list(VERBS))
def test_verb_that_needs_no_model_imports_neither_torch_nor_transformers(verb, inputs):
    argv, code, expected = VERBS[verb]
    proc, modules = run_verb(argv, inputs)
    assert proc.returncode == code and expected in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert sorted(modules & set(HEAVY)) == []


@pytest.mark.slow
def test_the_import_probe_sees_torch_and_transformers_where_a_verb_needs_them(tmp_path):
    """Negative control: `hitoban tokenizer` needs transformers (it fails afterwards on the missing corpus), and the
    same probe reports transformers and torch for it."""
    proc, modules = run_verb(["tokenizer", "--corpus", "missing", "--out", "tok"], tmp_path)
    said = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]  # torch imports at exit
    assert proc.returncode != 0 and "missing" in said[-1]
    assert {"torch", "transformers"} <= modules


@pytest.mark.parametrize("tied", [True, False])
def test_card_counts_parameters_from_the_safetensors_header_as_the_model_does(tied, tmp_path):
    """`hitoban card` counts parameters from config.json and the weights' header (no torch); the count is the
    instantiated model's, tied or untied; a config.json it cannot vouch for falls back to instantiating."""
    from hitoban import HitobanConfig, HitobanForCausalLM
    from hitoban.release.card import count_parameters, count_parameters_on_meta

    model = HitobanForCausalLM(HitobanConfig.from_preset("tiny", vocab_size=500, tie_word_embeddings=tied))
    model.save_pretrained(tmp_path)
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    counted, non_embedding, config = count_parameters(tmp_path)
    assert (counted, non_embedding) == (total, total - embed) == count_parameters_on_meta(tmp_path)[:2]
    assert config["hidden_size"] == 64 and config["vocab_size"] == 500
    edited = json.loads((tmp_path / "config.json").read_text())
    edited["vocab_size"] = 501  # disagrees with the saved embedding: counted from config.json, as before
    (tmp_path / "config.json").write_text(json.dumps(edited))
    assert count_parameters(tmp_path)[0] == total + (1 if tied else 2) * 64


def test_leak_scan_read_ahead_keeps_order_and_hash_stops_early_and_raises_the_readers_error(tmp_path):
    """`hitoban leaks` reads and hashes the next chunk in a thread while this one is scanned: the chunks arrive in
    order with the file's sha256, leaving early ends the thread, and a bad JSONL line still fails the scan."""
    import threading

    from hitoban.evaluation.leaks import LeakScanError, corpus_chunks, read_ahead, scan_for_leaks

    data = "".join(f"{i}行目の文章、" for i in range(40_000)).encode("utf-8")  # 1000-byte chunks split characters
    (tmp_path / "big.txt").write_bytes(data)
    digest = hashlib.sha256()
    assert b"".join(read_ahead(corpus_chunks(tmp_path / "big.txt", 1000, digest))) == data
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
    chunks = read_ahead(corpus_chunks(tmp_path / "big.txt", 1000), depth=1)
    assert next(chunks) == data[:1000]
    chunks.close()
    assert not [t for t in threading.enumerate() if t.name == "hitoban-leaks-read-ahead"]
    (tmp_path / "holdout.txt").write_text(LINE + "\n", encoding="utf-8")
    (tmp_path / "chats.jsonl").write_text('{"text": "ok"}\nnot json\n', encoding="utf-8")
    with pytest.raises(LeakScanError, match="chats.jsonl:2: not JSON"):
        scan_for_leaks(tmp_path / "holdout.txt", [tmp_path / "chats.jsonl"])
