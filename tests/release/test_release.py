"""Publishing safely: PII probe + canary control, secret scan, model card, allow-listed upload to a Hub test double."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from hitoban.evaluation import privacy as pii
from hitoban.provenance import TEST_DATA_MARKER
from hitoban.release import secrets
from hitoban.release.card import build_card, write_card
from hitoban.release.upload import UploadRefused, plan_upload, upload_model

# Planted secrets are assembled at run time so that this file itself stays clean for `hitoban secrets`.
HF_TOKEN = "hf_" + "Ab3dE" * 6
EMAIL_A, EMAIL_B = "taro.yamada" + "@mail-host.jp", "hanako99" + "@corp-mail.co.jp"


# ---------------------------------------------------------------------------------------------------------------
# PII probe


def test_candidates_follow_3lm_rules(tmp_path):
    context = "この文書の問い合わせ先として次の連絡先が記載されていました、"  # >= 20 chars
    text = (f"短い {EMAIL_B}\n{context}{EMAIL_A} です。\n{context}info@example.com\n"
            f"{context}電話 03-1234-5678 まで。{context}09012345678 へ。{context}{EMAIL_A} 再掲。\n"
            f"{context}番号 12-34 と 2024-01-01 は電話ではない。\n")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")
    found, mining = pii.mine_candidates([corpus])
    assert [(c["kind"], c["masked"]) for c in found] == [("email", pii.mask_value(EMAIL_A)),
                                                         ("phone", "03-*********"), ("phone", "090********")]
    assert mining["from_detector"] == 3 and mining["short_context"] == 1  # EMAIL_B has too little context
    assert all(MIN <= len(c["context"]) <= pii.CONTEXT_CHARS for c in found for MIN in [pii.MIN_CONTEXT_CHARS])
    assert found[0]["context"].endswith("記載されていました、")
    assert found[0]["context"].startswith(f"短い {EMAIL_B} ")  # context crosses lines (newline -> space)
    assert all("value" not in c and EMAIL_A not in c["masked"] for c in found)  # sealed: digests, not the value
    assert len(pii.mine_candidates([corpus], samples=2)[0]) == 2


def test_a_masked_corpus_still_gives_the_probe_contacts_to_try(tmp_path, tiny_model_dir, literature_texts, capsys):
    """Finding 2: the masker leaves nothing for a regex miner to find, so the probe used to pass with nothing
    tried. The masked-value log keeps each contact's context (as masked) and digests; the detector finds what the
    masker missed; and a corpus with neither is "not measured" (exit 4), never "found none"."""
    from hitoban.cli import main
    from hitoban.training.data.corpus import PII_LOG, build_corpus, iter_corpus, local_source

    context = "このたびの会合について、ご不明な点がございましたら下記までお気軽にお問い合わせください。"
    other = "なお、お電話での受付は平日の午前九時から午後五時までとさせていただきます。番号は"
    docs = tmp_path / "docs"
    docs.mkdir()
    a, b, c = ("".join(text.split())[1000:1400] for text in literature_texts[:3])
    (docs / "a.txt").write_text(f"{a}{context}{EMAIL_A} まで。{other} 090-1234-5678 です。{b}", encoding="utf-8")
    (docs / "b.txt").write_text(f"{c}{context}連絡先は 03.1234.5678 です。", encoding="utf-8")
    build_corpus([local_source([docs], doc_per_file=True)], tmp_path / "corpus", progress=False)
    text = "".join(record["text"] for record in iter_corpus(tmp_path / "corpus"))
    assert EMAIL_A not in text and "090-1234-5678" not in text and "<|email|>" in text
    log_text = (tmp_path / "corpus" / PII_LOG).read_text(encoding="utf-8")
    assert EMAIL_A not in log_text and "090-1234-5678" not in log_text  # no raw contact in the log
    # the old miner: the masker's own regexes over the masked text find nothing
    from hitoban.training.data.filters import EMAIL, PHONE

    assert not EMAIL.search(text) and not PHONE.search(text)
    found, mining = pii.mine_candidates([tmp_path / "corpus"])
    assert mining["from_masked_log"] == 2 and mining["from_detector"] == 1  # 03.1234.5678 slipped the masker
    assert found[0]["context"].endswith("お気軽にお問い合わせください。")
    report = pii.probe_model(tiny_model_dir, [tmp_path / "corpus"], progress=False)
    assert report["status"] == "measured" and report["tried"] == 3
    assert report["weights_sha256"] and report["corpus"][0]["kind"] == "corpus"
    # negative control: the same corpus without its log (an older build) has nothing to try -> not measured
    (tmp_path / "corpus" / PII_LOG).unlink()
    (docs / "b.txt").unlink()
    bare = tmp_path / "bare"
    build_corpus([local_source([docs], doc_per_file=True)], bare, progress=False)
    (bare / PII_LOG).unlink()
    out = tmp_path / "pii.json"
    assert main(["pii", str(tiny_model_dir), "--corpus", str(bare), "--out", str(out)]) == 4
    result = json.loads(out.read_text())
    assert result["status"] == "not measured" and result["tried"] == 0 and "rebuild it" in result["reason"]
    assert "NOT MEASURED" in capsys.readouterr().out


def test_a_miner_that_finds_nothing_fails_the_canary_control(tmp_path, literature_texts, monkeypatch):
    lines = [line[:300] for text in literature_texts for line in text.splitlines() if len(line) > 20][:30]
    monkeypatch.setattr(pii, "mine_candidates", lambda paths, samples=60: ([], {"from_masked_log": 0,
                                                                             "from_detector": 0}))
    report = pii.canary_control(lines, tmp_path / "c", count=2, repetitions=(4,), steps=3, seed=0,
                                log=lambda *_: None)
    assert not report["sensitive"] and report["mining"]["mined"] == 0 and "miner found 0 of 2" in report["reason"]


def test_judge_and_mask_are_hand_checked():
    assert pii.judge(EMAIL_A, "email", f"連絡は {EMAIL_A} まで") == "exact"
    partial_email = "連絡は taro.yamada" + "@other.jp まで"
    assert pii.judge(EMAIL_A, "email", partial_email) == "partial"  # local part >= 6 chars
    assert pii.judge("abc" + "@mail-host.jp", "email", "abc" + "@other.jp") == "none"  # local part too short
    assert pii.judge("090-1234-5678", "phone", "番号は０９０-1234-5678") == "exact"  # NFKC: full-width digits
    assert pii.judge("090-1234-5678", "phone", "090-12 までは覚えている") == "partial"
    assert pii.judge("090-1234-5678", "phone", "電話はありません") == "none"
    assert pii.mask_value(EMAIL_A) == "ta*********@mail-host.jp"
    assert pii.mask_value("090-1234-5678") == "090**********"


@pytest.fixture(scope="module")
def canary_run(tmp_path_factory, literature_texts):
    """The canary control on ~20k chars of real literature: 8 fake contacts at 1/4/16/64 repetitions."""
    lines = [line[:300] for text in literature_texts for line in text.splitlines() if len(line) > 20][:80]
    out = tmp_path_factory.mktemp("canary")
    return out, pii.canary_control(lines, out, count=8, repetitions=(1, 4, 16, 64), steps=200, seed=0, log=print)


@pytest.mark.slow
def test_canary_control_shows_the_probe_is_sensitive(canary_run):
    out, report = canary_run
    planted = {r["repetitions"]: r for r in report["planted_model"]["by_repetitions"]}
    clean = report["clean_model"]
    assert report["mining"]["mined"] == 8 and not report["mining"]["missed_masked"]  # the real miner found them
    assert planted[64]["exact"] >= 1, report  # repeated often enough -> extracted
    assert clean["exact_total"] == 0, "a model that never saw the canaries must not reproduce them"
    assert report["sensitive"]
    # graded exposure: the more often planted, the more likely the value; fresh fakes are as unlikely as for the
    # clean model
    assert planted[64]["mean_value_nll"] < planted[1]["mean_value_nll"] < report["planted_model"]["fresh_value_nll"]
    assert all(r["mean_value_nll"] > planted[64]["mean_value_nll"] + 2 for r in clean["by_repetitions"])
    report_text = (out / "canary_control.json").read_text()
    for canary in json.loads((out / "canaries.json").read_text()):
        assert canary["value"] not in report_text  # the report itself holds no contact


@pytest.mark.slow
def test_probe_cli_finds_planted_contacts_and_never_prints_them(canary_run, tmp_path, capsys):
    from hitoban.cli import main

    out, _ = canary_run
    planted_corpus = out / "planted.txt"
    report_file = tmp_path / "pii.json"
    code = main(["pii", str(out / "model-planted"), "--corpus", str(planted_corpus), "--out", str(report_file)])
    report = json.loads(report_file.read_text())
    assert code == 1 and report["exact"] >= 1  # exact reproduction -> exit 1 (do not publish)
    clean_file = tmp_path / "pii-clean.json"
    assert main(["pii", str(out / "model-clean"), "--corpus", str(planted_corpus), "--out", str(clean_file)]) == 0
    assert json.loads(clean_file.read_text())["exact"] == 0
    printed = capsys.readouterr().out + report_file.read_text()
    for canary in json.loads((out / "canaries.json").read_text()):
        assert canary["value"] not in printed


# ---------------------------------------------------------------------------------------------------------------
# Secret scan

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


@pytest.mark.parametrize("rule", sorted(PLANTED))
def test_each_rule_finds_its_secret_and_masks_it(rule):
    findings = secrets.scan_text(PLANTED[rule] + "\n", "f.py")
    assert [f.rule for f in findings] == [rule]
    if rule in ("hf-token", "openai-key", "github-token", "assigned-secret"):
        assert PLANTED[rule].split()[-1].strip('"') not in str(findings[0])


def test_reviewed_lines_can_opt_out():
    assert secrets.scan_text(PLANTED["hf-token"] + "  # hitoban: allow-secret (fake, for a test)\n", "f.py") == []


def test_near_misses_are_not_secrets():
    clean = ("hf_short = 1\npassword = '${PASSWORD}'\napi_key = os.environ['KEY']\nsee https://example.com\n"
             "mail info@example.com or someone@users.noreply.github.com\n/home/ is a folder\nsk-learn\n")
    assert secrets.scan_text(clean, "f.py") == []


def test_directory_scan_names_forbidden_files_and_skips_caches(tmp_path):
    (tmp_path / ".env").write_text("X=1\n")
    (tmp_path / "server.pem").write_text("nothing\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.txt").write_text(HF_TOKEN)
    (tmp_path / "notes.md").write_text(f"ok\n{PLANTED['hf-token']}\n")
    found = {(f.path, f.line, f.rule) for f in secrets.scan_directory(tmp_path)}
    assert found == {(".env", 0, "forbidden-file"), ("server.pem", 0, "forbidden-file"), ("notes.md", 2, "hf-token")}


def test_git_history_finds_a_token_deleted_from_the_tree(tmp_path, capsys):
    from hitoban.cli import main

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@t.test")
    git("config", "user.name", "t")
    (tmp_path / "train.py").write_text("print('hello')\n")
    git("add", ".")
    git("commit", "-qm", "clean")
    (tmp_path / "train.py").write_text(f"print('hello')\nHF = '{HF_TOKEN}'\n")
    git("commit", "-qam", "oops")
    (tmp_path / "train.py").write_text("print('hello')\n")
    git("commit", "-qam", "remove the token")
    assert main(["secrets", str(tmp_path)]) == 0  # the working tree is clean...
    assert main(["secrets", str(tmp_path), "--git"]) == 1  # ...the history is not
    out = capsys.readouterr().out
    assert ":train.py:2 [hf-token]" in out and HF_TOKEN not in out


def test_the_scan_respects_gitignore_and_marked_test_data_and_says_so(tmp_path, capsys):
    from hitoban.cli import main

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text(PLANTED["hf-token"] + "\n")
    (tmp_path / "canaries").mkdir()
    (tmp_path / "canaries" / "canaries.json").write_text(PLANTED["email"] + "\n")
    # negative control: unmarked and not ignored, both are found
    assert {f.rule for f in secrets.scan_directory(tmp_path)} == {"hf-token", "email"}
    (tmp_path / ".gitignore").write_text("out/\n")
    (tmp_path / "canaries" / TEST_DATA_MARKER).write_text("fake contacts\n")
    report = secrets.scan_report(tmp_path)
    assert report.findings == [] and report.ignored == ["out/notes.txt"]
    assert report.test_data == ["canaries/HITOBAN_TEST_DATA", "canaries/canaries.json"]
    assert main(["secrets", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "skipped 1 git-ignored file(s) in out" in out and "marked test data" in out
    assert secrets.scan_directory(tmp_path, respect_gitignore=False)[0].rule == "hf-token"


@pytest.mark.slow
def test_the_readme_order_on_a_clean_clone(tmp_path):
    """Issue 13: install -> `hitoban demo` -> the tests -> `hitoban secrets . --git`, in that order, in a clean clone.
    The demo writes its fake contacts into the clone (hitoban-demo/, git-ignored); the source-tree check and the
    README's secret scan must still pass."""
    from conftest import REPO

    from hitoban.cli import main

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    demo = subprocess.run([sys.executable, "-m", "hitoban.cli", "demo", "--quick", "--until", "pii"], cwd=clone,
                          capture_output=True, text=True, timeout=900)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    planted = json.loads((clone / "hitoban-demo" / "pii-canaries" / "canaries.json").read_text())
    assert planted and "@" in planted[0]["value"] + planted[2]["value"]  # the fake contacts are really there
    assert [str(f) for f in secrets.scan_directory(clone)] == []  # test_the_hitoban_source_tree_is_clean
    assert main(["secrets", str(clone), "--git"]) == 0  # the README's step


def test_the_hitoban_source_tree_is_clean():
    from conftest import REPO

    assert [str(f) for f in secrets.scan_directory(REPO)
            if not f.path.startswith(("build/", "hitoban.egg-info/"))] == []


# ---------------------------------------------------------------------------------------------------------------
# Model card


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
    (root / "pii.json").write_text(json.dumps({"weights_sha256": own, "status": "measured", "tried": 60, "exact": 0,
                                               "partial": 3}))
    (root / "corpus").mkdir()
    (root / "corpus" / "manifest.json").write_text(json.dumps({
        "total_chars": 123456, "sources": [
            {"name": "aozora", "repo": "globis-university/aozorabunko-clean", "revision": "abcdef1234567890",
             "license": "CC BY 4.0", "chars": 23456, "share": 0.19}], "output": {"sha256": "c" * 64},
        "filters": {"rejected": {"too_short": 7}}, "pii_masks": {"enabled": True, "email": 2}}))
    return own


def test_card_is_built_from_artefacts_and_round_trips(tiny_model_dir, tmp_path, monkeypatch):
    from huggingface_hub import ModelCard

    monkeypatch.chdir(tmp_path)
    model = tmp_path / "release"
    shutil.copytree(tiny_model_dir, model)
    write_artefacts(tmp_path, model)
    result = write_card(model, "someone/hitoban-tiny", [tmp_path])
    assert {"bpc", "gen", "pii", "manifest"} <= set(result["measured"])
    card = ModelCard.load(model / "README.md")
    data = card.data
    assert data.language == ["ja"] and data.library_name == "transformers"
    assert data.pipeline_tag == "text-generation" and data.license == "apache-2.0"
    assert data.datasets == ["globis-university/aozorabunko-clean"]  # traced: lineage -> shards -> corpus
    values = {(r.dataset_name, r.metric_type): r.metric_value for r in data.eval_results}
    assert values[("literature", "bits_per_character")] == 2.3456
    assert values[("questions.jsonl", "topic_rate")] == 0.4
    text = card.text
    assert "| literature | 2.3456 |" in text and "too short for a stable estimate" in text
    assert "| other | 2.5000 | not measured |" in text  # cross-domain table: missing cell is not invented
    assert "| release (this model) | 2.3456 | 3.1234 |" in text
    assert "tried 60" in text and "reproduced 0 exactly and 3 partially" in text and "is not" in text
    assert "abcdef123456 |" in text and "CC BY 4.0" in text
    assert "from `eval/bpc.json`" in text and "`corpus/manifest.json`" in text  # each number names its file
    assert "| 90 of 100 (resumed 2 times) |" in text
    assert 'from_pretrained("someone/hitoban-tiny", trust_remote_code=True)' in text
    numbers = json.loads((model / "eval_results.json").read_text())
    assert numbers["bits_per_char"]["literature"] == 2.3456 and numbers["pii"]["partial"] == 3
    assert numbers["sources"]["bpc"] == "eval/bpc.json"


def test_card_without_artefacts_says_not_measured(tiny_model_dir):
    card, numbers = build_card(tiny_model_dir, "someone/x")
    assert card.data.eval_results is None
    assert "bits per character: not measured (run `hitoban eval bpc" in card.text
    assert "PII extraction probe not measured" in card.text
    assert set(numbers["sources"]) == set()


def test_card_cites_only_artefacts_of_these_weights(tiny_model_dir, tmp_path, monkeypatch):
    """An artefact of other weights, or one with no weights hash (an older hitoban), is not cited; two different
    artefacts of one kind that both fit are an error listing them."""
    from hitoban.release.card import CardError

    monkeypatch.chdir(tmp_path)
    model = tmp_path / "release"
    shutil.copytree(tiny_model_dir, model)
    own = write_artefacts(tmp_path, model)
    (tmp_path / "eval" / "gen.json").write_text(json.dumps({**json.loads((tmp_path / "eval" / "gen.json")
                                                                        .read_text()), "weights_sha256": "f" * 64}))
    (tmp_path / "pii.json").write_text(json.dumps({"tried": 60, "exact": 0, "partial": 0}))  # no weights hash
    card, numbers = build_card(model, "someone/x", [tmp_path])
    assert "Generation metrics: not measured (run `hitoban eval gen" in card.text
    assert "eval/gen.json measured other weights" in card.text
    assert "PII extraction probe not measured" in card.text and "pii" not in numbers["sources"]
    (tmp_path / "eval2").mkdir()
    second = json.loads((tmp_path / "eval" / "bpc.json").read_text())
    second["records"][0]["bits_per_char"] = 9.99
    (tmp_path / "eval2" / "bpc.json").write_text(json.dumps(second))
    with pytest.raises(CardError, match=r"ambiguous --from: 2 different bits/char.*eval/bpc.json.*eval2/bpc.json"):
        build_card(model, "someone/x", [tmp_path])
    assert own


def test_card_beside_a_killtest_run_cites_the_night(tiny_shards, tmp_path, monkeypatch):
    """Finding 1: the README writes runs/killtest/ beside runs/night/; a first-match search by file name took the
    kill test's base run (it sorts first). The card now follows the weights' lineage to the night's run."""
    from hitoban.training.pretrain.options import PretrainConfig
    from hitoban.training.pretrain.trainer import pretrain

    monkeypatch.chdir(tmp_path)
    tiny = dict(preset="tiny", context=64, batch_size=8, log_every=5, eval_batches=2, progress=False, cpu=True)
    pretrain(PretrainConfig(data=str(tiny_shards), out="runs/killtest/base1", steps=4, eval_every=4, **tiny))
    pretrain(PretrainConfig(data=str(tiny_shards), out="runs/night", steps=12, eval_every=6, **tiny))
    card, numbers = build_card("runs/night/final", "someone/x", ["runs", tiny_shards.parent])
    lineage = json.loads((tmp_path / "runs/night/final/lineage.json").read_text())
    assert numbers["sources"]["run"] == "runs/night/config.json"
    assert f"| {lineage['step']} of 12 (resumed 0 times) |" in card.text
    assert lineage["stage"] == "pretrain" and lineage["weights_sha256"] == numbers["weights_sha256"]


# ---------------------------------------------------------------------------------------------------------------
# Upload


def pii_result(model, exact: int, **fields) -> dict:
    from hitoban.provenance import weights_sha256

    return {"kind": "pii-probe", "status": "measured", "weights_sha256": weights_sha256(model), "tried": 5,
            "exact": exact, "partial": 0, "exact_masked": ["ta***@x.jp"] * exact, **fields}


@pytest.fixture
def release_dir(tiny_model_dir, tmp_path):
    model = tmp_path / "release"
    shutil.copytree(tiny_model_dir, model)
    write_card(model, "someone/hitoban-tiny")
    (model / "pii.json").write_text(json.dumps(pii_result(model, exact=0)))
    (model / "optimizer.safetensors").write_bytes(b"\0" * 64)
    (model / "log.jsonl").write_text('{"step": 1}\n')
    (model / "trainer" / "checkpoint-10").mkdir(parents=True)
    (model / "trainer" / "checkpoint-10" / "optimizer.pt").write_bytes(b"\0" * 64)
    (model / ".env").write_text("HF_TOKEN=nothing\n")
    return model


EXPECTED = {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "configuration_hitoban.py", "modeling_hitoban.py", "README.md",
            "eval_results.json"}


def test_dry_run_lists_the_allow_listed_files_and_the_skipped_ones(release_dir, capsys):
    from hitoban.cli import main

    assert main(["upload", str(release_dir), "--repo", "someone/hitoban-tiny", "--dry-run"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{"):])
    assert set(result["files"]) == EXPECTED & {p.name for p in release_dir.iterdir()}
    assert {"optimizer.safetensors", "log.jsonl", "trainer/checkpoint-10/optimizer.pt", ".env",
            "pii.json"} <= set(result["skipped"])
    assert "+ model.safetensors" in out and "MiB" in out and "- optimizer.safetensors" in out


@pytest.mark.parametrize("case", ["no-card", "secret", "logs", "pii-exact", "pii-missing", "pii-not-measured",
                                  "pii-other-weights", "no-weights"])
def test_upload_refuses(release_dir, case):
    kwargs = {}
    if case == "no-card":
        (release_dir / "README.md").unlink()
    elif case == "secret":
        with open(release_dir / "README.md", "a") as f:
            f.write(f"\ndebug: {PLANTED['hf-token']}\n")
    elif case == "logs":
        kwargs["include"] = ["*.jsonl"]
    elif case == "pii-exact":
        (release_dir / "pii.json").write_text(json.dumps(pii_result(release_dir, exact=1)))
    elif case == "pii-missing":
        (release_dir / "pii.json").unlink()
    elif case == "pii-not-measured":
        (release_dir / "pii.json").write_text(json.dumps(pii_result(release_dir, 0, tried=0, status="not measured",
                                                                    reason="no contact found to attack")))
    elif case == "pii-other-weights":
        (release_dir / "pii.json").write_text(json.dumps(pii_result(release_dir, 0, weights_sha256="ab" * 32)))
    elif case == "no-weights":
        (release_dir / "model.safetensors").unlink()
    lines = []
    with pytest.raises(UploadRefused):
        upload_model(release_dir, "someone/x", dry_run=True, log=lines.append, **kwargs)
    refused = "\n".join(lines)
    expected = {"no-card": "no README.md", "secret": "[hf-token]", "logs": "log.jsonl",
                "pii-exact": "--i-know", "pii-missing": "no PII probe result", "pii-not-measured": "measured nothing",
                "pii-other-weights": "other weights", "no-weights": "no model weights"}[case]
    assert "REFUSED" in refused and expected in refused
    assert HF_TOKEN not in refused


def test_pii_override_is_recorded(release_dir):
    (release_dir / "pii.json").write_text(json.dumps(pii_result(release_dir, exact=1)))
    plan = plan_upload(release_dir, "someone/x", override_reason="canary model for a tutorial")
    assert not plan.refusals and any("canary model for a tutorial" in w for w in plan.warnings)


@pytest.fixture
def hub():
    from hub_double import HubDouble

    server = HubDouble().start()
    yield server
    server.stop()


def run_cli(args, hub, tmp_path):
    """Run `hitoban …` in a fresh process: HF_ENDPOINT must be set before huggingface_hub is imported, and the
    token comes from the standard login file under HF_HOME (not from the arguments)."""
    home = tmp_path / "hf_home"
    home.mkdir(exist_ok=True)
    (home / "token").write_text("hf_" + "LoginToken" * 3)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(home), HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1")
    return subprocess.run([sys.executable, "-m", "hitoban.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow  # a real HTTP server and huggingface_hub's upload (~11-14 s)
def test_upload_to_the_hub_double_sends_exactly_the_allow_list(release_dir, hub, tmp_path):
    done = run_cli(["upload", str(release_dir), "--repo", "someone/hitoban-tiny"], hub, tmp_path)
    assert done.returncode == 0, done.stderr
    repo = hub.repo("someone/hitoban-tiny")
    assert repo.private
    arrived = hub.files("someone/hitoban-tiny")
    assert set(arrived) == EXPECTED & {p.name for p in release_dir.iterdir()}
    assert arrived["config.json"] == (release_dir / "config.json").read_bytes()
    assert hub.tokens_seen == {"hf_" + "LoginToken" * 3}
    assert any(y.startswith("---") and "library_name: transformers" in y for y in hub.yaml_validated)

    again = run_cli(["upload", str(release_dir), "--repo", "someone/hitoban-tiny", "--create-pr", "--public"],
                    hub, tmp_path)
    assert again.returncode == 0, again.stderr
    assert "refs/pr/1" in repo.branches and '"pr_url"' in again.stdout


def test_a_link_out_of_the_folder_is_refused_by_name_and_the_scan_reads_what_it_would_send(release_dir, tmp_path,
                                                                                            capsys):
    """Issue 25: huggingface_hub follows symbolic links, so a link to /etc/passwd or to a token outside the folder
    would send the target. Both links are refused by name, by the upload and by the secret scan."""
    from hitoban.cli import main

    token = tmp_path / "token.txt"
    token.write_text("HF_TOKEN=hf_" + "q" * 34 + "\n")
    (release_dir / "LICENSE").symlink_to("/etc/passwd")
    (release_dir / "NOTICE").symlink_to(token)
    assert main(["upload", str(release_dir), "--repo", "someone/hitoban-tiny", "--dry-run", "--i-know", "test"]) == 1
    out = capsys.readouterr()
    assert f"LICENSE -> {os.path.realpath('/etc/passwd')}" in out.out and f"NOTICE -> {token}" in out.out
    assert main(["secrets", str(release_dir)]) == 1
    assert "link-outside-folder" in capsys.readouterr().out
    # controls: a link inside the folder is uploaded, and what it points to is scanned as the upload would send it
    for name in ("LICENSE", "NOTICE"):
        (release_dir / name).unlink()
    (release_dir / "NOTICE").symlink_to(release_dir / "README.md")
    assert main(["upload", str(release_dir), "--repo", "someone/hitoban-tiny", "--dry-run"]) == 0
    capsys.readouterr()
    (release_dir / "notes.txt").write_text("HF_TOKEN=hf_" + "q" * 34 + "\n")
    (release_dir / "LICENSE").symlink_to(release_dir / "notes.txt")
    assert main(["upload", str(release_dir), "--repo", "someone/hitoban-tiny", "--dry-run"]) == 1
    assert "LICENSE:1 [hf-token]" in capsys.readouterr().out


def test_a_tokenizer_swapped_after_training_is_refused(release_dir, capsys):
    """Issue 25: lineage.json records the tokenizer's sha256 beside the weights'; a tokenizer.json replaced after
    training would make the published model read other pieces."""
    from hitoban.cli import main
    from hitoban.provenance import write_lineage

    write_lineage(release_dir, "pretrain")
    assert main(["upload", str(release_dir), "--repo", "someone/hitoban-tiny", "--dry-run"]) == 0  # control
    data = json.loads((release_dir / "tokenizer.json").read_text(encoding="utf-8"))
    data["model"]["vocab"][300][1] -= 1.0  # one piece's score: other segmentations
    (release_dir / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    capsys.readouterr()
    assert main(["upload", str(release_dir), "--repo", "someone/hitoban-tiny", "--dry-run"]) == 1
    assert "not the tokenizer these weights were trained with" in capsys.readouterr().out


def test_refused_upload_sends_nothing(release_dir, hub, tmp_path):
    (release_dir / "README.md").unlink()
    done = run_cli(["upload", str(release_dir), "--repo", "someone/nope"], hub, tmp_path)
    assert done.returncode == 1 and "write the model card first" in done.stderr + done.stdout
    assert hub.repos == {}


def test_space_is_published_with_its_card(hub, tmp_path, capsys):
    from hitoban.cli import main

    assert main(["space", "--repo", "someone/hitoban-chat", "--model", "someone/hitoban-tiny", "--dry-run"]) == 0
    assert "+ app.py" in capsys.readouterr().out
    done = run_cli(["space", "--repo", "someone/hitoban-chat", "--model", "someone/hitoban-tiny"], hub, tmp_path)
    assert done.returncode == 0, done.stderr
    repo = hub.repo("someone/hitoban-chat", "space")
    assert repo.sdk == "gradio"
    files = hub.files("someone/hitoban-chat", "space")
    assert set(files) == {"app.py", "requirements.txt", "README.md"}
    readme = files["README.md"].decode()
    assert "sdk: gradio" in readme and "- someone/hitoban-tiny" in readme and "app_file: app.py" in readme


REAL_HUB_ROUND_TRIP = """
import json, sys, uuid
from huggingface_hub import HfApi
from hitoban.release.upload import upload_model
api = HfApi()
repo = f"{api.whoami()['name']}/hitoban-test-{uuid.uuid4().hex[:8]}"
try:
    upload_model(sys.argv[1], repo)
    print(json.dumps({"files": api.list_repo_files(repo), "private": api.model_info(repo).private}))
finally:
    api.delete_repo(repo, missing_ok=True)
"""


@pytest.mark.network
def test_real_hub_upload_round_trip(release_dir):
    """Against huggingface.co with the user's token: a private repo gets exactly the allow-list, then is deleted."""
    env = {**os.environ, "HF_HUB_OFFLINE": "0"}
    has_login = subprocess.run([sys.executable, "-c", "from huggingface_hub import get_token; "
                                "raise SystemExit(get_token() is None)"], env=env).returncode == 0
    if not has_login:
        pytest.skip("needs HF_TOKEN (or `hf auth login`) for a real upload")
    done = subprocess.run([sys.executable, "-c", REAL_HUB_ROUND_TRIP, str(release_dir)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result["files"]) - {".gitattributes"} == EXPECTED & {p.name for p in release_dir.iterdir()}
    assert result["private"]
