"""`card --format llama` and `upload --format llama` (release/formats.py): the verified Llama export is published in
place of the hitoban folder, plain transformers loads it with no remote code, and the gates accept the hitoban
weights' measurements only for an export verified against them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from release_helpers import write_artefacts
from safetensors.torch import load_file, save_file

from hitoban.modeling import from_llama
from hitoban.provenance import read_lineage, weights_sha256
from hitoban.release.card import write_card
from hitoban.release.formats import llama_export_dir
from hitoban.release.upload import UploadRefused, upload_model

REPO_ID = "someone/hitoban-tiny"
LLAMA_FILES = {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja", "tokenizer.model", "README.md", "eval_results.json", "lineage.json"}


@pytest.fixture
def published(tiny_model_dir, tmp_path, monkeypatch):
    """A hitoban folder with its lineage, evaluation artefacts and PII probe, carded in the Llama format."""
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "release"
    shutil.copytree(tiny_model_dir, model)
    write_artefacts(tmp_path, model)
    shutil.copy(tmp_path / "pii.json", model / "pii.json")
    (tmp_path / "pii.json").unlink()
    result = write_card(model, REPO_ID, [tmp_path], fmt="llama", log=lambda *_: None)
    return model, result


def test_the_llama_card_cites_the_hitoban_weights_measurements_and_needs_no_remote_code(published):
    from huggingface_hub import ModelCard

    model, result = published
    export = llama_export_dir(model)
    assert result["card"] == str(export / "README.md") and {"bpc", "gen", "pii", "manifest"} <= set(result["measured"])
    lineage = read_lineage(export)
    assert lineage["stage"] == "export-llama" and lineage["weights_sha256"] == weights_sha256(export)
    assert lineage["base"]["weights_sha256"] == weights_sha256(model) and lineage["verification"]["greedy_identical"]
    card = ModelCard.load(export / "README.md")
    assert "llama" in card.data.tags and "custom_code" not in card.data.tags
    text = card.text
    assert f'AutoModelForCausalLM.from_pretrained("{REPO_ID}")' in text and "trust_remote_code=True" not in text
    assert "measured on the hitoban model it was exported from, release, whose logits" in text  # the bits/char, named
    assert "tried 60" in text and "from_llama" in text and weights_sha256(model)[:16] in text
    numbers = json.loads((export / "eval_results.json").read_text())
    assert numbers["format"] == "llama" and numbers["llama_export"]["max_abs_logit_diff"] <= 1e-5
    assert numbers["weights_sha256"] == weights_sha256(export)
    # the hitoban card of the same folder still says how to load it with remote code
    write_card(model, REPO_ID, [model.parent])
    assert "trust_remote_code=True" in (model / "README.md").read_text()


def test_upload_format_llama_sends_the_export_after_verifying_it(published):
    model, _ = published
    lines = []
    result = upload_model(model, REPO_ID, dry_run=True, log=lines.append, fmt="llama")
    assert set(result["files"]) == LLAMA_FILES and not any(f.endswith(".py") for f in result["files"])
    assert any("verified against" in line for line in lines)


def test_the_gates_accept_the_hitoban_weights_only_for_a_verified_export(published):
    """Negative controls: the same export sent as a plain folder (its lineage unverified) is refused by the PII gate;
    an export whose weights were changed (its lineage forged to match), a stale export and remote code are refused."""
    model, _ = published
    export = llama_export_dir(model)
    lines = []
    with pytest.raises(UploadRefused):  # not --format llama: the PII probe measured other weights
        upload_model(export, REPO_ID, dry_run=True, log=lines.append, pii_report=str(model / "pii.json"))
    assert "other weights" in "\n".join(lines)

    config = json.loads((export / "config.json").read_text())
    (export / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "x.Y"}}))
    lines = []
    with pytest.raises(UploadRefused):
        upload_model(model, REPO_ID, dry_run=True, log=lines.append, fmt="llama")
    assert "not a plain Llama config" in "\n".join(lines)
    (export / "config.json").write_text(json.dumps(config))

    weights = load_file(str(export / "model.safetensors"))
    name = next(k for k in weights if k.endswith("mlp.down_proj.weight"))
    weights[name] = weights[name] + 1e-2
    save_file(weights, str(export / "model.safetensors"), metadata={"format": "pt"})
    lineage = read_lineage(export)
    (export / "lineage.json").write_text(json.dumps({**lineage, "weights_sha256": weights_sha256(export)}))
    with pytest.raises(UploadRefused, match="does not match"):
        upload_model(model, REPO_ID, dry_run=True, log=lambda *_: None, fmt="llama")

    shutil.rmtree(export)
    with pytest.raises(UploadRefused, match="--format llama"):  # no export yet: the card makes it
        upload_model(model, REPO_ID, dry_run=True, log=lambda *_: None, fmt="llama")
    write_card(model, REPO_ID, [model.parent], fmt="llama", log=lambda *_: None)
    weights = load_file(str(model / "model.safetensors"))  # the hitoban folder retrained after its export
    weights[name.replace("down_proj", "down_proj")] = weights[name] * 1.5
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UploadRefused, match="exported from other weights"):
        upload_model(model, REPO_ID, dry_run=True, log=lambda *_: None, fmt="llama")


LOAD_WITHOUT_HITOBAN = """
import json, sys
sys.modules["hitoban"] = None  # this process cannot import hitoban
from transformers import AutoModelForCausalLM, AutoTokenizer
for folder in sys.argv[1:]:  # one process for every folder: each line says what loading that folder gave
    try:
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
    except Exception as err:
        print("\\nRESULT", json.dumps({"error": f"{type(err).__name__}: {err}"}))
        continue
    ids = tok("吾輩は猫である。", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    print("\\nRESULT", json.dumps({"class": type(model).__name__, "ids": out[0].tolist()}))
"""


@pytest.mark.slow
def test_plain_transformers_loads_the_export_with_no_prompt_and_hitoban_loads_it_back(published):
    model, _ = published
    export = llama_export_dir(model)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    # the export, then the control (the hitoban folder itself, which stops at the remote-code question), in one
    # process that cannot import hitoban
    done = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_HITOBAN, str(export), str(model)], capture_output=True,
                          text=True, env=env, stdin=subprocess.DEVNULL, timeout=300)
    assert done.returncode == 0, done.stderr
    loaded, control = [json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    from transformers import AutoTokenizer

    from hitoban.modeling import HitobanForCausalLM

    ours = HitobanForCausalLM.from_pretrained(model).eval()
    ids = AutoTokenizer.from_pretrained(model)("吾輩は猫である。", return_tensors="pt").input_ids
    expected = ours.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=ours.config.pad_token_id)
    assert loaded == {"class": "LlamaForCausalLM", "ids": expected[0].tolist()}
    assert "trust_remote_code" in control.get("error", ""), control
    # hitoban's own class loads the export back: the same weights, bit for bit
    back = from_llama(export)
    assert type(back) is HitobanForCausalLM
    mine, theirs = ours.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_from_llama_refuses_a_llama_hitoban_cannot_express(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    grouped = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128,
                                           num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2))
    grouped.save_pretrained(tmp_path / "gqa")
    with pytest.raises(ValueError, match="num_key_value_heads"):
        from_llama(tmp_path / "gqa")
