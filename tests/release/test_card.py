"""The model card (release/card.py): built only from artefacts of these weights; what was not measured says so."""

from __future__ import annotations

import json
import shutil

import pytest
from release_helpers import write_artefacts

from hitoban.release.card import build_card, write_card


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
