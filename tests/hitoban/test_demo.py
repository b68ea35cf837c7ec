"""`hitoban demo --quick`: the whole pipeline on the built-in text, checked for sanity through its report."""

from __future__ import annotations

import json
import re

import pytest


@pytest.mark.slow
def test_every_stage_ran_and_the_report_links_real_files(demo):
    out, report = demo
    assert [r["stage"] for r in report["stages"]] == ["corpus", "tokenizer", "shards", "calibrate", "pretrain",
                                                      "sft", "eval", "leaks", "pii", "card", "upload", "load"]
    text = (out / "report.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert len(links) >= 15 and all((out / link).exists() for link in links), links
    assert any(link.endswith(".png") for link in links)
    for row in report["stages"]:
        assert f"| {row['stage']} |" in text


@pytest.mark.slow
def test_loss_fell_and_the_killed_run_resumed_bit_identically(demo):
    _, report = demo
    pretrain = report["pretrain"]
    assert pretrain["loss_last"] < pretrain["loss_first"] - 1.0
    assert pretrain["resumes"] == 2 and 0 < pretrain["killed_at_steps"][0] < pretrain["steps"]
    assert pretrain["killed_bit_identical"] and pretrain["passed"] and pretrain["checks"]["control_detected"]
    out, _ = demo
    killtest = json.loads((out / "killtest.json").read_text())  # the one schema `hitoban killtest` writes
    assert killtest["kind"] == "kill-test" and killtest["restore"]["exact"] and killtest["noise"] == 0.0
    sft = report["sft"]
    assert sft["best_val_loss"] < sft["first_val_loss"]


@pytest.mark.slow
def test_checks_and_release(demo):
    out, report = demo
    assert report["leaks"] is False
    assert report["pii"]["canary_sensitive"], "the canary control must show the PII probe can find a leak"
    assert all(0 < v < 20 for v in report["eval"]["bits_per_char"].values())
    files = set(report["upload"]["files"])
    assert {"model.safetensors", "README.md", "modeling_hitoban.py", "tokenizer.json"} <= files
    assert "pii.json" not in files and not any(f.startswith("trainer") for f in files)
    assert isinstance(report["load"], str)
    card = (out / "release" / "README.md").read_text(encoding="utf-8")
    assert "bit-identical" in card and "bits/char" in card


@pytest.mark.slow
def test_demo_refuses_a_used_folder(demo):
    from hitoban.cli import main

    out, _ = demo
    assert main(["demo", "--quick", "--out", str(out)]) == 2


def test_force_replaces_an_earlier_demo_and_nothing_else(tmp_path):
    from hitoban.cli import main

    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--until", "corpus"]) == 0
    assert main(["demo", "--quick", "--out", str(out), "--until", "corpus"]) == 2  # used: refused
    (out / "mine.txt").write_text("left by the previous demo run\n")
    assert main(["demo", "--quick", "--out", str(out), "--until", "corpus", "--force"]) == 0
    assert not (out / "mine.txt").exists() and (out / "corpus" / "manifest.json").exists()
    other = tmp_path / "my-thesis"
    other.mkdir()
    (other / "chapter1.txt").write_text("not a demo\n")
    assert main(["demo", "--quick", "--out", str(other), "--until", "corpus", "--force"]) == 2
    assert (other / "chapter1.txt").exists()  # --force never deletes a folder the demo did not make


def test_the_recipe_inputs_are_there_and_read_by_the_real_readers(tmp_path):
    """Issue 13: every input the README recipe names exists after the demo, in a format its verb reads."""
    from hitoban.cli import main
    from hitoban.evaluation.generation import load_questions
    from hitoban.evaluation.leaks import read_holdout
    from hitoban.training.data.chat import read_conversations, read_holdout_pairs
    from hitoban.training.data.corpus import local_source

    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--until", "corpus"]) == 0
    inputs = out / "recipe-inputs"
    assert len(list(local_source([str(inputs / "my_texts")], doc_per_file=True).documents())) >= 30
    chats, info = read_conversations([inputs / "chats.jsonl"])
    assert len(chats) >= 50 and info["bad_lines"] == 0 and len(read_conversations([inputs / "tone.jsonl"])[0]) == 20
    assert len(read_holdout_pairs(inputs / "holdout.txt")) >= 8 and all(len(t) == 2 for t in read_holdout(
        inputs / "holdout.txt") if t)
    assert len(load_questions(inputs / "questions.jsonl")) == 10
    assert (inputs / "eval" / "prose.txt").stat().st_size > 500 and "chats.jsonl" in (inputs / "README.md").read_text()
    assert 5_000 < len((inputs / "small.txt").read_text(encoding="utf-8")) < 20_000


def test_validation_summary_says_when_the_model_memorises():
    from hitoban.demo import validation_summary

    assert validation_summary([(10, 7.5), (20, 6.0), (30, 6.02)]) == "val loss 7.50 -> best 6.00 at step 20"
    rose = validation_summary([(10, 7.5), (20, 6.0), (60, 7.7)])
    assert "-> 7.70 at step 60: it rose again, the model is memorising" in rose


def test_own_files_as_source_up_to_the_shards(tmp_path, corpus):
    """--source PATH with more distinct characters than the built-in text (the tokenizer must still fit them), and
    --until stops cleanly with a report of the stages that ran."""
    from hitoban.cli import main

    files = [str(p) for p in sorted((corpus / "literature").glob("0*.txt"))[:3]]
    out = tmp_path / "own"
    assert main(["demo", "--quick", "--out", str(out), "--until", "shards", "--source", *files]) == 0
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert [r["stage"] for r in report["stages"]] == ["corpus", "tokenizer", "shards"]
    assert report["tokenizer"] > 2000 and report["shards"]["train"] > 0
    assert not (out / "release").exists() and (out / "report.md").exists()


@pytest.mark.network
def test_demo_on_an_aozora_slice(tmp_path):
    from hitoban.cli import main

    out = tmp_path / "aozora"
    assert main(["demo", "--quick", "--out", str(out), "--source", "aozora", "--until", "pretrain"]) == 0
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["corpus"] > 100_000 and report["pretrain"]["loss_last"] < report["pretrain"]["loss_first"]
