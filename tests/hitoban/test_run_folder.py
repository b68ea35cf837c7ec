"""hitoban/run_folder.py: one type writes and reads a run folder's config.json, log.jsonl, heartbeat.json and
summary.json, for pretraining and federated runs; a schema-1 config.json (before `given`/`resolved`) still reads."""

from __future__ import annotations

import json

import pytest

from hitoban.errors import InputError, MissingInputError
from hitoban.run_folder import RunFolder, run_config, setting

FINGERPRINT = {"model_config": {"hidden_size": 64}, "tokenizer_sha256": "t" * 64, "data_index_sha256": "d" * 64,
               "lr": 3e-3, "context": 64, "total_steps": 30, "precision": "no"}
BEAT = {"updated_at": 1000.0, "step": 5, "total_steps": 20, "tokens_seen": 500, "token_budget": 2000,
        "train_loss": 5.5, "best_val": None, "lr": 3e-4, "tok_per_sec": 1200.0, "elapsed_hours": 0.5,
        "eta_hours": 1.5, "peak_gb": None, "resumes": 0, "finished": False, "stop_reason": None}
FEDERATED_BEAT = {"kind": "federated-heartbeat", "schema": 1, "round": 2, "tokens_seen": 640, "token_budget": 6400,
                  "machines": {"a": {"tok_s": 10.0}}, "reissued": 0, "bytes_sent": 1024, "train_loss": None,
                  "best_val": None, "eta_hours": None, "elapsed_hours": 0.1, "resumes": 0, "finished": False,
                  "updated_at": 1000.0}


def test_config_round_trips_each_value_once(tmp_path):
    folder = RunFolder(tmp_path / "run")
    given = {"lr": 3e-3, "precision": "auto", "compile": "auto", "context": None, "steps": 30}
    folder.write_config("pretrain-run", given, {"lr": 3e-3, "precision": "no", "compile": False, "context": 64,
                                                 "total_steps": 30},
                        run_id="abc", fingerprint=FINGERPRINT, hardware="cpu")
    raw = json.loads(folder.config_path.read_text())
    assert raw["kind"] == "pretrain-run" and raw["schema"] == 2 and raw["given"] == given
    assert raw["resolved"] == {"precision": "no", "compile": False, "context": 64, "total_steps": 30}  # lr: given
    config = folder.config()
    assert {k: v for k, v in config.items() if k != "fingerprint"} == {k: v for k, v in raw.items()
                                                                        if k != "fingerprint"}
    assert config["run_id"] == "abc" and config["fingerprint"] == FINGERPRINT
    assert setting(config, "lr") == 3e-3 and setting(config, "precision") == "no" and setting(config, "steps") == 30
    assert setting(config, "nothing", "default") == "default"
    with pytest.raises(ValueError, match="kind"):
        folder.write_config("pretrain", given, {})
    with pytest.raises(ValueError, match="overwrite"):
        folder.write_config("pretrain-run", given, {}, schema=3)


def test_a_schema_1_config_reads_as_the_same_view(tmp_path):
    """config.json as the night wrote it before schema 2 (args + the values again at the top), and a federated
    run's (its part under "federated"): read into given / resolved, so old run folders still read."""
    old = {"kind": "pretrain-run", "schema": 1, "run_id": "r1", "model": FINGERPRINT["model_config"],
           "args": {"lr": 3e-3, "precision": "auto", "optimizer": "adamw", "schedule": "cosine", "steps": 30},
           "data_index_sha256": "d" * 64, "tokenizer_sha256": "t" * 64, "total_steps": 30, "tokens_per_step": 512,
           "hardware": "cpu", "compiled": False, "device_plan": {"precision_used": "no", "why": "cpu"},
           "fingerprint": FINGERPRINT}
    (tmp_path / "config.json").write_text(json.dumps(old))
    config = RunFolder(tmp_path).config()
    assert config["kind"] == "pretrain-run" and config["schema"] == 1 and config["run_id"] == "r1"
    assert config["given"] == old["args"] and config["fingerprint"] == FINGERPRINT
    assert config["resolved"] == {"context": 64, "precision": "no", "compile": False, "total_steps": 30,
                                  "tokens_per_step": 512}
    assert config["hardware"] == "cpu" and config["device_plan"] == old["device_plan"]
    assert "args" not in config and "model" not in config  # each value once, in the view too
    assert setting(config, "optimizer") == "adamw" and setting(config, "total_steps") == 30
    federated = {**old, "args": {**old["args"], "outer_lr": 0.7}, "federated": {"outer_lr": 0.7}}
    assert run_config(federated)["kind"] == "federated-run"
    # a config from before the fingerprint: its trajectory's identity from the top-level values
    bare = {k: v for k, v in old.items() if k != "fingerprint"}
    assert run_config(bare)["fingerprint"] == {"model_config": FINGERPRINT["model_config"],
                                                "data_index_sha256": "d" * 64, "tokenizer_sha256": "t" * 64}


@pytest.mark.parametrize("text, words", [
    ("{not json", "not valid JSON"), ("[1, 2]", "not an object"),
    (json.dumps({"kind": "pretrain-run", "schema": 2, "given": [], "resolved": {}}), "field 'given'"),
    (json.dumps({"kind": "pretrain-run", "schema": 1, "args": "lr=3"}), "field 'args'")])
def test_a_damaged_config_is_refused_in_one_line(tmp_path, text, words):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(InputError, match=words) as err:
        RunFolder(tmp_path).config()
    assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)
    (tmp_path / "config.json").unlink()
    with pytest.raises(MissingInputError, match="not found"):
        RunFolder(tmp_path).config()


def test_heartbeats_of_both_kinds_round_trip_and_a_damaged_one_is_refused(tmp_path):
    folder = RunFolder(tmp_path)
    assert folder.heartbeat_now() is None  # not written yet
    for beat in (BEAT, FEDERATED_BEAT):
        folder.heartbeat(beat)
        assert folder.heartbeat_now() == beat
        assert [p.name for p in tmp_path.iterdir()] == ["heartbeat.json"]  # atomic: no temporary left
    for damaged, words in ((b'{"step": 5', "not valid JSON"), (json.dumps({**BEAT, "step": "5"}).encode(),
                                                                 "field 'step'"),
                           (json.dumps({**BEAT, "best_val": "low"}).encode(), "field 'best_val'"),
                           (json.dumps({k: v for k, v in FEDERATED_BEAT.items() if k != "machines"}).encode(),
                            "field 'machines' is missing"), (b"\xff\xfe", "not valid utf-8")):
        folder.heartbeat_path.write_bytes(damaged)
        with pytest.raises(InputError, match=words) as err:
            folder.heartbeat_now()
        assert "\n" not in str(err.value)


def test_log_appends_and_a_torn_last_line_is_left_out(tmp_path):
    folder = RunFolder(tmp_path / "new")  # the first record makes the folder
    folder.log({"type": "train", "step": 5, "loss": 5.0, "text": "吾輩"})
    folder.log({"type": "eval", "step": 5, "val_loss": 5.5})
    folder.log({"type": "train", "step": 10, "loss": 4.5})
    lines = folder.log_path.read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[0]) == {"type": "train", "step": 5, "loss": 5.0, "text": "吾輩"} and "吾輩" in lines[0]
    assert [r["step"] for r in folder.records("train")] == [5, 10] and len(folder.records()) == 3
    with open(folder.log_path, "a", encoding="utf-8") as f:
        f.write('{"type": "train", "st')  # a crash mid-line
    records, note = folder.log_records()
    assert len(records) == 3 and "line 4 is half-written" in note
    resumed = RunFolder(tmp_path / "new")  # the resumed run's writer drops the torn line, then appends
    resumed.log({"type": "resume", "step": 10})
    resumed.log({"type": "train", "step": 15, "loss": 4.0})
    records, note = resumed.log_records()
    assert note is None and [r["type"] for r in records] == ["train", "eval", "train", "resume", "train"]
    with pytest.raises(MissingInputError, match="no training log"):
        RunFolder(tmp_path / "empty").records()


def test_a_log_that_is_not_a_file_is_refused(tmp_path):
    (tmp_path / "log.jsonl").mkdir()
    with pytest.raises(InputError, match="not a regular file"):
        RunFolder(tmp_path).log({"type": "train", "step": 1})


def test_summary_round_trips(tmp_path):
    folder = RunFolder(tmp_path)
    assert folder.summary() is None
    folder.write_summary("pretrain-summary", {"steps": 30, "stop_reason": "budget"})
    assert folder.summary() == {"kind": "pretrain-summary", "schema": 1, "steps": 30, "stop_reason": "budget"}
    folder.summary_path.write_text("[]")
    with pytest.raises(InputError, match="not an object"):
        folder.summary()


def test_the_card_reads_a_run_config_of_either_schema(tmp_path):
    """`hitoban card` finds a run's config.json among the --from artefacts and reads it through run_config: the
    recipe and budget come out the same from a schema-1 folder and a schema-2 one."""
    from hitoban.release.card import collect
    from hitoban.release.card_text import _recipe

    given = {"lr": 8e-3, "optimizer": "muon", "schedule": "wsd", "precision": "auto", "steps": 30}
    new, old = tmp_path / "new", tmp_path / "old"
    RunFolder(new).write_config("pretrain-run", given, {"total_steps": 30, "tokens_per_step": 512},
                                run_id="r2", fingerprint=FINGERPRINT)
    old.mkdir()
    (old / "config.json").write_text(json.dumps({"kind": "pretrain-run", "schema": 1, "run_id": "r1", "args": given,
                                                 "total_steps": 30, "tokens_per_step": 512,
                                                 "fingerprint": FINGERPRINT}))
    for folder in (new, old):
        [run] = collect(folder, [])["run"]
        assert _recipe(run.data) == "Muon on hidden matrices + AdamW on the rest, warmup-stable-decay schedule, " \
                                    "peak lr 0.008"
        assert setting(run.data, "tokens_per_step") == 512 and run.data["fingerprint"] == FINGERPRINT


def test_config_json_holds_each_setting_once_and_reads_back_whole(tmp_path):
    """Issue 36: --precision was held four times in config.json with two values, --lr three times. Written once
    (given or resolved), the fingerprint and device plan name them and the view fills them back in."""
    folder = RunFolder(tmp_path / "run")
    given = {"lr": 2e-3, "precision": "auto", "context": None, "optimizer": "muon"}
    fingerprint = {**FINGERPRINT, "lr": 2e-3, "precision": "bf16", "context": 64, "optimizer": "muon",
                   "total_steps": 30}
    plan = {"precision": "bf16", "bf16_native": True, "muon_dtype": "bfloat16", "precision_used": "bf16"}
    folder.write_config("pretrain-run", given, {"precision": "bf16", "context": 64, "total_steps": 30},
                        run_id="r", fingerprint=fingerprint, device_plan=plan)
    text = folder.config_path.read_text()
    raw = json.loads(text)
    assert text.count('"bf16"') == 1 and text.count("0.002") == 1  # precision used and lr: once each
    assert raw["fingerprint"]["from_settings"] == ["context", "lr", "optimizer", "precision", "total_steps"]
    view = folder.config()
    assert view["fingerprint"] == fingerprint and view["device_plan"] == plan
    # an explicit precision that differs from the plan's: both facts kept, each once
    folder.write_config("pretrain-run", {**given, "precision": "no"}, {"context": 64, "total_steps": 30},
                        run_id="r", fingerprint={**fingerprint, "precision": "no"},
                        device_plan={**plan, "precision_used": "no"})
    view = folder.config()
    assert view["device_plan"]["precision"] == "bf16" and view["device_plan"]["precision_used"] == "no"
    assert view["fingerprint"]["precision"] == "no"


def test_negative_control_a_fingerprint_value_not_in_the_settings_is_stored(tmp_path):
    """A fingerprint value that differs from the run's setting is never dropped for a name: the resume's identity
    must read back as it was, or the card's kill-test match would compare the wrong thing."""
    folder = RunFolder(tmp_path)
    folder.write_config("pretrain-run", {"lr": 2e-3}, {}, fingerprint={"lr": 3e-3, "model_config": {}})
    raw = json.loads(folder.config_path.read_text())
    assert raw["fingerprint"]["lr"] == 3e-3 and raw["fingerprint"]["from_settings"] == []
    assert folder.config()["fingerprint"] == {"lr": 3e-3, "model_config": {}}
