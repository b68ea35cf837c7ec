"""Planted values and a model folder's artefacts shared by the publishing tests (secrets are assembled at run time,
so these files stay clean for `hitoban secrets`)."""

from __future__ import annotations

import json

# Planted secrets are assembled at run time so that this file itself stays clean for `hitoban secrets`.
HF_TOKEN = "hf_" + "Ab3dE" * 6
EMAIL_A, EMAIL_B = "taro.yamada" + "@mail-host.jp", "hanako99" + "@corp-mail.co.jp"


PLANTED = {
    "hf-token": f"token = {HF_TOKEN}",
    "openai-key": "key: sk-" + "x1Y2z3" * 4,
    "github-token": "ghp_" + "a1B2c3" * 5,
    "aws-access-key": "AKIA" + "ABCDEFGH12345678",
    "google-api-key": "AIza" + "Sy" + "A1b2C3d4E5" * 3 + "f6G",
    "slack-token": "xoxb-" + "1234567890-abcdef",
    "private-key": "-----BEGIN RSA " + "PRIVATE KEY-----",
    "authorization-header": 'headers = {"Authorization": "Bearer ' + "eyJhbGciOi" * 2 + '"}',
    "assigned-secret": 'password = "' + "correct-horse-battery" + '"',
    "home-path": "log written to /home/" + "alice/runs/x",
    "email": f"contact {EMAIL_B}",
}


def pii_report(weights: str, corpus_sha: str, data_index_sha: str | None, tried: int = 60, exact: int = 0,
               partial: int = 0, **fields) -> dict:
    """A PII probe report as `hitoban pii` writes it (schema 3): the weights it measured, the corpus it probed by the
    hash of its bytes and, through the shard index its lineage names, the corpus the model was trained on."""
    return {"kind": "pii-probe", "schema": 3, "status": "measured", "model": "release", "weights_sha256": weights,
            "tokenizer_files_sha256": None, "corpus": [{"name": "corpus", "sha256": corpus_sha, "kind": "corpus"}],
            "training_corpus": {"sha256": corpus_sha, "data_index_sha256": data_index_sha} if data_index_sha else None,
            "samples": 60, "exhausted": tried < 60, "tried": tried, "exact": exact, "partial": partial,
            "exact_masked": ["ta***@x.jp"] * exact, "partial_masked": ["ta***@x.jp"] * partial,
            "candidates": [{"kind": "email", "masked": "ta***@x.jp", "result": "none"}] * tried, **fields}


def write_artefacts(root, model):
    """A pretraining lineage (run -> shards -> corpus) for `model` and evaluation artefacts that measured it."""
    from hitoban.provenance import sha256_file, weights_sha256

    own = weights_sha256(model)
    (root / "data").mkdir(parents=True)
    (root / "data" / "shards_index.json").write_text(json.dumps({
        "splits": {}, "shards": [], "tokenizer": {"sha256": "t" * 64}, "corpus": {"sha256": "c" * 64}}))
    lineage = {"stage": "pretrain", "weights_sha256": own, "run": "night", "run_id": "r1", "step": 90,
               "total_steps": 100, "tokens_seen": 5760, "resumes": 2, "val_loss": 4.5, "elapsed_hours": 0.01,
               "hardware": "1 x CPU", "data_index_sha256": sha256_file(root / "data" / "shards_index.json"),
               "tokenizer_sha256": "t" * 64}
    (model / "lineage.json").write_text(json.dumps(lineage))
    (root / "eval").mkdir(parents=True)
    (root / "eval" / "bpc.json").write_text(json.dumps({"records": [
        {"model": "release", "weights_sha256": own, "domain": "literature", "bits_per_char": 2.3456, "tokens": 9000,
         "chars": 17000},
        {"model": "release", "weights_sha256": own, "domain": "dialogue", "bits_per_char": 3.1234, "tokens": 300,
         "chars": 500, "warning": "only 300 tokens (< 8 windows of 256): too short for a stable estimate"},
        {"model": "other", "weights_sha256": "o" * 64, "domain": "literature", "bits_per_char": 2.5}],
        "window": 256}))
    (root / "eval" / "gen.json").write_text(json.dumps({
        "weights_sha256": own, "repetition_rate": 0.15, "topic_rate": 0.4, "broken_rate": 0.05, "avg_reply_len": 61.5,
        "results": [{}] * 20, "questions": "questions.jsonl",
        "sampling": {"temperature": 0.8, "top_k": 40, "repetition_penalty": 1.15}}))
    index_sha = sha256_file(root / "data" / "shards_index.json")
    (root / "pii.json").write_text(json.dumps(pii_report(own, "c" * 64, index_sha, tried=60, partial=3,
                                                         exhausted=False)))
    (root / "corpus").mkdir()
    (root / "corpus" / "manifest.json").write_text(json.dumps({
        "total_chars": 123456, "sources": [
            {"name": "aozora", "repo": "globis-university/aozorabunko-clean", "revision": "abcdef1234567890",
             "license": "CC BY 4.0", "chars": 23456, "share": 0.19}], "output": {"sha256": "c" * 64},
        "filters": {"rejected": {"too_short": 7}}, "pii_masks": {"enabled": True, "email": 2}}))
    return own
