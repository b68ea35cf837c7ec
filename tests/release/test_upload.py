"""The allow-listed upload (release/upload.py): what is planned and sent, every refusal, the identity of weights and
tokenizer, the PII gate, against a Hub double."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from release_helpers import HF_TOKEN, PLANTED, pii_report

from hitoban.evaluation import privacy as pii
from hitoban.release.card import write_card
from hitoban.release.upload import UploadRefused, plan_upload, upload_model


def training_data(root) -> tuple[str, str]:
    """A `hitoban corpus` folder and the shard index built from it, as the README lays them out (data/corpus,
    data/shards): (the corpus's sha256, the index's sha256)."""
    from hitoban.provenance import sha256_file

    (root / "data" / "corpus").mkdir(parents=True, exist_ok=True)
    (root / "data" / "shards").mkdir(exist_ok=True)
    documents = root / "data" / "corpus" / "documents.jsonl"
    documents.write_text('{"text": "吾輩は猫である。連絡先は ta****@example.jp です。"}\n', encoding="utf-8")
    corpus_sha = sha256_file(documents)
    (root / "data" / "corpus" / "manifest.json").write_text(json.dumps({
        "output": {"name": "documents.jsonl", "sha256": corpus_sha, "bytes": documents.stat().st_size},
        "total_chars": 30, "total_documents": 1, "sources": []}))
    index = root / "data" / "shards" / "shards_index.json"
    index.write_text(json.dumps({"corpus": {"sha256": corpus_sha, "documents": 1}, "shards": []}))
    return corpus_sha, sha256_file(index)


def pii_result(model, exact: int, tried: int = 5, **fields) -> dict:
    """The PII report of `model` (in a release_dir) probed on its training corpus, trying all of its contacts."""
    from hitoban.provenance import read_lineage, sha256_file, weights_sha256

    corpus_sha = sha256_file(model.parent / "data" / "corpus" / "documents.jsonl")
    return pii_report(weights_sha256(model), corpus_sha, read_lineage(model)["data_index_sha256"],
                      tried=tried, exact=exact, **fields)


@pytest.fixture
def release_dir(tiny_model_dir, tmp_path):
    """A model folder as hitoban leaves it (lineage.json naming its shards, the corpus beside them, its PII probe),
    carded, with what must never be uploaded planted beside it."""
    from hitoban.provenance import write_lineage

    model = tmp_path / "release"
    shutil.copytree(tiny_model_dir, model)
    _, index_sha = training_data(tmp_path)
    write_lineage(model, "pretrain", data_index_sha256=index_sha)
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
            "eval_results.json", "lineage.json"}


def test_dry_run_lists_the_allow_listed_files_and_the_skipped_ones(release_dir, capsys):
    from hitoban.cli import main

    assert main(["upload", str(release_dir), "--repo", "someone/hitoban-tiny", "--dry-run"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{"):])
    assert set(result["files"]) == EXPECTED & {p.name for p in release_dir.iterdir()}
    assert {"optimizer.safetensors", "log.jsonl", "trainer/", ".env", "pii.json"} <= set(result["skipped"])
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
    # controls: a link inside the folder to a file of its own name is uploaded, and what it points to is scanned as
    # the upload would send it; a link giving a file another name is refused (a NOTICE that is really the README)
    for name in ("LICENSE", "NOTICE"):
        (release_dir / name).unlink()
    (release_dir / "legal").mkdir()
    (release_dir / "legal" / "NOTICE").write_text("Copyright the authors.\n")
    (release_dir / "NOTICE").symlink_to(release_dir / "legal" / "NOTICE")
    assert main(["upload", str(release_dir), "--repo", "someone/hitoban-tiny", "--dry-run"]) == 0
    capsys.readouterr()
    (release_dir / "legal" / "LICENSE").write_text("HF_TOKEN=hf_" + "q" * 34 + "\n")
    (release_dir / "LICENSE").symlink_to(release_dir / "legal" / "LICENSE")
    assert main(["upload", str(release_dir), "--repo", "someone/hitoban-tiny", "--dry-run"]) == 1
    assert "LICENSE:1 [hf-token]" in capsys.readouterr().out
    (release_dir / "LICENSE").unlink()
    (release_dir / "LICENSE").symlink_to(release_dir / "README.md")
    assert main(["upload", str(release_dir), "--repo", "someone/hitoban-tiny", "--dry-run"]) == 1
    assert "a symbolic link to a file of another name" in capsys.readouterr().out


def test_a_tokenizer_swapped_after_training_is_refused(release_dir, capsys):
    """Issue 25: lineage.json records the tokenizer's sha256 beside the weights'; a tokenizer.json replaced after
    training would make the published model read other pieces."""
    from hitoban.cli import main

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


def _refusals(model, **kwargs) -> list[str]:
    return plan_upload(model, "someone/hitoban-tiny", **kwargs).refusals


def _resave_sharded(model) -> None:
    """The same folder's weights saved again with max_shard_size: other files, one index, the same tensors."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(model / "model.safetensors"))
    (model / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:]), 1):
        shard = f"model-{i:05d}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, str(model / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _edit_json(path, change) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


IDENTITY_MUTATIONS = {
    "sharded beside the original's pii.json": _resave_sharded,
    "an extra shard beside model.safetensors": lambda m: shutil.copy(m / "model.safetensors",
                                                                     m / "model-00002-of-00002.safetensors"),
    "a swapped tokenizer.json": lambda m: _edit_json(m / "tokenizer.json",
                                                     lambda d: d["model"]["vocab"][300].__setitem__(1, -99.0)),
    "a replaced chat_template.jinja": lambda m: (m / "chat_template.jinja").write_text("{{ messages }}"),
    "an edited tokenizer_config.json": lambda m: _edit_json(m / "tokenizer_config.json",
                                                            lambda d: d.__setitem__("model_max_length", 7)),
    "no lineage.json": lambda m: (m / "lineage.json").unlink(),
    "a lineage without tokenizer_sha256": lambda m: _edit_json(m / "lineage.json", lambda d: d.pop("tokenizer_sha256")),
    "a lineage without tokenizer_files_sha256": lambda m: _edit_json(
        m / "lineage.json", lambda d: d.pop("tokenizer_files_sha256")),
    "a lineage that is not an object": lambda m: (m / "lineage.json").write_text("[1, 2]"),
    "a swapped tokenizer with a lineage rewritten for it by hand": lambda m: (
        (m / "chat_template.jinja").write_text("{{ x }}"),
        _edit_json(m / "lineage.json", lambda d: d.pop("tokenizer_files_sha256"))),
}


@pytest.mark.parametrize("mutation", sorted(IDENTITY_MUTATIONS))
def test_gates_compare_the_identity_of_every_weight_and_tokenizer_file(release_dir, mutation):
    """Issue 35.1: the upload certifies a model by the content of all its weight files (sharded or single, index
    included) and all its tokenizer files (chat template included), against its lineage and its PII probe; where it
    cannot establish the identity it refuses. Negative controls on the real path: the folder hitoban saved passes,
    each mutation of it is refused, even with --i-know (an override is for a PII finding, never for identity)."""
    assert _refusals(release_dir) == []  # the control: what hitoban wrote
    IDENTITY_MUTATIONS[mutation](release_dir)
    refusals = _refusals(release_dir, override_reason="identity is not overridable")
    assert refusals, mutation
    assert all("\n" not in r for r in refusals if "secret scan" not in r)


def test_sharded_weights_have_their_own_identity_and_pass_when_probed(release_dir):
    """Sharded weights are not skipped by the gates: once their own lineage and PII probe name them, they pass."""
    from hitoban.provenance import weights_sha256, write_lineage

    single = weights_sha256(release_dir)
    _resave_sharded(release_dir)
    assert weights_sha256(release_dir) != single
    assert any("other weights" in r or "lineage" in r for r in _refusals(release_dir))
    lineage = json.loads((release_dir / "lineage.json").read_text())
    write_lineage(release_dir, "pretrain", data_index_sha256=lineage["data_index_sha256"])
    (release_dir / "pii.json").write_text(json.dumps(pii_result(release_dir, exact=0)))
    plan = plan_upload(release_dir, "someone/hitoban-tiny")
    assert plan.refusals == []
    assert {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
            "model.safetensors.index.json"} <= {p for p, _ in plan.included}
    (release_dir / "model-00002-of-00002.safetensors").unlink()  # an index naming a missing shard: no identity
    assert any("weights are not" in r for r in _refusals(release_dir))


PII_FIELDS = ["kind", "schema", "status", "weights_sha256", "tried", "exact", "partial", "samples", "exact_masked",
              "partial_masked", "candidates", "exhausted", "corpus", "training_corpus"]


JUNK = [None, "2", -1, 1.5, True, [], {}, "x" * 64, [{"name": "c"}]]


def test_the_pii_report_reader_names_every_malformed_field(release_dir):
    """Issue 35.2: one validating reader for pii.json. Every field of a real report, deleted or replaced by each
    value of another type or range, is a PIIReportError (one line, naming the file) or a refusal, never a traceback
    and never a pass. `"exact": "2"` used to end in a traceback."""
    from hitoban.release.upload import PIIReportError, read_pii_report

    good = json.loads((release_dir / "pii.json").read_text())
    read_pii_report(release_dir / "pii.json")  # the control
    for key in PII_FIELDS:
        for value in [...] + JUNK:
            report = dict(good)
            if value is ...:
                report.pop(key)
            else:
                report[key] = value
            if key == "training_corpus" and value is None:
                continue  # null is allowed (then the upload cannot establish the corpus, tested below)
            (release_dir / "pii.json").write_text(json.dumps(report))
            try:
                read_pii_report(release_dir / "pii.json")
                accepted = True
            except PIIReportError as err:
                accepted = False
                assert "pii.json" in str(err) and "\n" not in str(err)
            refusals = _refusals(release_dir)
            assert not accepted or refusals or report[key] == good[key], (key, value)
            assert accepted or any("pii.json" in r for r in refusals), (key, value)
    (release_dir / "pii.json").write_text("{not json")
    with pytest.raises(PIIReportError, match="not a readable JSON report"):
        read_pii_report(release_dir / "pii.json")


def _mutated_pii(model, case: str) -> dict:
    from hitoban.provenance import sha256_file

    report = pii_result(model, exact=0)
    unrelated = model.parent / "unrelated.txt"
    unrelated.write_text("ただの一行。\n", encoding="utf-8")
    if case == "an unrelated one-line file, tried 1":
        report.update(corpus=[{"name": "unrelated.txt", "sha256": sha256_file(unrelated), "kind": "file"}],
                      training_corpus=None, tried=1, candidates=report["candidates"][:1])
    elif case == "asked for one contact":
        report.update(samples=1, tried=1, candidates=report["candidates"][:1], exhausted=False)
    elif case == "tried 5 of 60 without exhausting the corpus":
        report.update(exhausted=False)
    elif case == "a trimmed corpus":
        report["corpus"][0]["sha256"] = "0" * 64
    elif case == "the corpus link of other shards":
        report["training_corpus"]["data_index_sha256"] = "1" * 64
    elif case == "no corpus link":
        report["training_corpus"] = None
    elif case == "the unrelated file beside the training corpus":
        report["corpus"].append({"name": "unrelated.txt", "sha256": sha256_file(unrelated), "kind": "file"})
    return report


PII_CORPUS_CASES = ["an unrelated one-line file, tried 1", "asked for one contact",
                    "tried 5 of 60 without exhausting the corpus", "a trimmed corpus",
                    "the corpus link of other shards", "no corpus link",
                    "the unrelated file beside the training corpus"]


@pytest.mark.parametrize("case", PII_CORPUS_CASES)
def test_the_pii_gate_needs_enough_probes_on_the_training_corpus(release_dir, case):
    """Issue 35.2: a PII report speaks for a model only when it probed the corpus the model's lineage says it was
    trained on (by the hash of the bytes probed) and tried >= 20 contacts or every one the corpus has."""
    assert _refusals(release_dir) == []
    (release_dir / "pii.json").write_text(json.dumps(_mutated_pii(release_dir, case)))
    refusals = _refusals(release_dir)
    assert len(refusals) == 1 and "--i-know" in refusals[0], refusals


def test_the_pii_gate_refuses_a_model_whose_training_corpus_is_not_recorded(release_dir):
    from hitoban.provenance import write_lineage

    write_lineage(release_dir, "pretrain")  # no data_index_sha256, no corpus, no fine-tuning data
    assert any("cannot establish the model's training corpus" in r for r in _refusals(release_dir))


def test_the_probe_records_what_it_read_and_the_corpus_the_lineage_names(release_dir):
    """The real path of `hitoban pii`: the report carries the model's identity, the hash of the corpus bytes and,
    through the shard index the lineage names (found beside the corpus), the training corpus; a trimmed corpus
    then has another identity and the upload refuses it."""
    from hitoban.provenance import sha256_file, weights_sha256
    from hitoban.release.upload import read_pii_report

    corpus = release_dir.parent / "data" / "corpus"
    report = pii.probe_model(release_dir, [corpus], out=release_dir.parent / "probe.json", progress=False)
    read_pii_report(release_dir.parent / "probe.json")
    assert report["weights_sha256"] == weights_sha256(release_dir) and report["tokenizer_files_sha256"]
    assert report["corpus"][0]["sha256"] == sha256_file(corpus / "documents.jsonl")
    assert report["training_corpus"]["sha256"] == report["corpus"][0]["sha256"]
    with open(corpus / "documents.jsonl", "a", encoding="utf-8") as f:
        f.write('{"text": "足された一行"}\n')
    assert pii.corpus_identity(corpus)["sha256"] != report["training_corpus"]["sha256"]


ISSUE_35_PATHS = ["LICENSE.d/train_000.bin", "LICENSE.d/corpus.txt", "configuration_x/notes.py",
                  "model-data/a-of-b.safetensors", "model.safetensors/inner.bin"]


def _minimal_folder(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "hitoban"}')
    (folder / "README.md").write_text("# card\n")


def _check_plan(folder, included) -> None:
    """What every plan must satisfy: top-level, allowed by name, a regular file inside the folder, not NEVER."""
    from hitoban.release.upload import MODEL_ALLOW, NEVER, has_control_characters

    root = os.path.realpath(folder)
    for rel, _ in included:
        assert "/" not in rel and not has_control_characters(rel), rel
        real = os.path.realpath(folder / rel)
        assert real.startswith(root + os.sep) and os.path.isfile(real), rel
        assert any(__import__("fnmatch").fnmatchcase(rel, p) for p in MODEL_ALLOW), rel
        assert not any(__import__("fnmatch").fnmatchcase(os.path.basename(real), p) for p in NEVER), rel


def test_the_issue_35_paths_are_never_planned(tmp_path):
    import torch

    from hitoban.release.upload import MODEL_ALLOW, plan_files

    folder = tmp_path / "m"
    _minimal_folder(folder)
    for rel in ISSUE_35_PATHS:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(b"\x01\x00" * 100)
    (folder / "ckpt").mkdir()
    torch.save({"state": {0: {"exp_avg": torch.zeros(3)}}}, folder / "ckpt" / "optimizer.pt")
    (folder / "LICENSE").symlink_to(folder / "ckpt" / "optimizer.pt")
    included, skipped, refusals = plan_files(folder, MODEL_ALLOW)
    assert {p for p, _ in included} == {"config.json", "README.md"}
    assert any(r.startswith("LICENSE -> ckpt/optimizer.pt") for r in refusals), refusals
    _check_plan(folder, included)


SNIFFED = {
    "NOTICE": lambda p: __import__("torch").save({"exp_avg": __import__("torch").zeros(2)}, p),
    "LICENSE": lambda p: p.write_bytes(__import__("numpy").arange(500, dtype="uint16").tobytes()),
    "LICENSE.txt": lambda p: p.write_text('{"text": "a corpus document"}\n{"text": "another"}\n'),
    "metrics.json": lambda p: p.write_bytes(__import__("pickle").dumps({"step": 3}, protocol=4)),
    "model.safetensors": lambda p: __import__("safetensors.torch").torch.save_file(
        {"model.layers.0.mlp.weight.m": __import__("torch").zeros(2), "step": __import__("torch").zeros(1)}, str(p)),
    "tokenizer.json": lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0"),
    "README.md": lambda p: p.write_text("x" * (3 * 2**20)),
}


@pytest.mark.parametrize("name", sorted(SNIFFED))
def test_what_a_file_is_decides_not_its_name(tmp_path, name):
    """Optimizer state, token shards, pickles, JSON lines and oversized 'cards' are refused whatever they are
    called, directly and through a link inside the folder."""
    from hitoban.release.upload import MODEL_ALLOW, plan_files

    folder = tmp_path / "m"
    _minimal_folder(folder)
    SNIFFED[name](folder / "payload")
    (folder / name).unlink(missing_ok=True)
    os.replace(folder / "payload", folder / name)
    _, _, refusals = plan_files(folder, MODEL_ALLOW)
    assert any(r.startswith(name) for r in refusals), refusals
    os.replace(folder / name, folder / "data.raw")
    (folder / name).symlink_to(folder / "data.raw")
    included, _, refusals = plan_files(folder, MODEL_ALLOW)
    assert any(r.startswith(f"{name} -> data.raw") for r in refusals) and name not in dict(included), refusals


def _segments():
    from hypothesis import strategies as st

    allowed = ["LICENSE", "LICENSE.d", "LICENSE.txt", "NOTICE", "README.md", "config.json", "configuration_x",
               "configuration_x.py", "model-data", "model-00001-of-00002.safetensors", "tokenizer.json",
               "chat_template.jinja", "optimizer.pt", "train_000.bin", "corpus.txt", "log.jsonl", ".env", "ckpt"]
    odd = st.text(st.characters(codec="utf-8", exclude_characters="/\0"), min_size=1, max_size=12).filter(
        lambda s: s not in (".", ".."))
    return st.one_of(st.sampled_from(allowed), odd, st.sampled_from(allowed).map(lambda s: s + "\x1b[31m"),
                     st.sampled_from(allowed).map(lambda s: "\u202e" + s))


def test_the_plan_only_ever_holds_allowed_top_level_regular_files(tmp_path):
    """Issue 35.4, by generation: trees of random names (allowed names used as folders, control and bidi
    characters, nesting) with links to inside and outside files and folders; whatever the tree, the plan holds only
    allowed top-level regular files inside the folder, and a name with control characters is refused."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from hitoban.release.upload import MODEL_ALLOW, has_control_characters, plan_files

    outside = tmp_path / "outside.txt"
    outside.write_text("secret\n")
    entries = st.lists(st.tuples(st.lists(_segments(), min_size=1, max_size=3),
                                 st.sampled_from(["file", "binary", "link-in", "link-out", "link-dir"])),
                       min_size=1, max_size=8)
    counter = iter(range(10**9))

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(entries)
    def check(tree):
        folder = tmp_path / f"t{next(counter)}"
        _minimal_folder(folder)
        for segments, kind in tree:
            path = folder.joinpath(*segments)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                if path.exists() or path.is_symlink():
                    continue
                if kind == "file":
                    path.write_text("text\n")
                elif kind == "binary":
                    path.write_bytes(b"\0\1\2" * 10)
                elif kind == "link-in":
                    path.symlink_to(folder / "README.md")
                elif kind == "link-out":
                    path.symlink_to(outside)
                else:
                    path.symlink_to(tmp_path)
            except (OSError, ValueError):
                continue  # a name the file system refuses
        included, skipped, refusals = plan_files(folder, MODEL_ALLOW)
        _check_plan(folder, included)
        for name in os.listdir(folder):
            if has_control_characters(name):
                assert any(repr(name) in r or name in r for r in refusals), name

    check()
