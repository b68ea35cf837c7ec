"""--report-to (training/trackers.py): the night's log.jsonl numbers in TensorBoard and trackio, read back with
their own readers; a resume continues the same tracker run; a missing tracker package is a clear error."""

from __future__ import annotations

import json

import pytest
from conftest import night_config

from hitoban.errors import UsageError
from hitoban.training.pretrain.trainer import pretrain
from hitoban.training.trackers import parse_report_to, scalars


def test_report_to_is_a_list_of_known_trackers():
    assert parse_report_to("none") == [] and parse_report_to(None) == []
    assert parse_report_to("tensorboard, trackio,tensorboard") == ["tensorboard", "trackio"]
    for bad in ("tensorbord", "none,wandb"):
        with pytest.raises(UsageError, match="--report-to"):
            parse_report_to(bad)


def test_scalars_are_the_records_numbers_under_their_type():
    record = {"type": "eval", "step": 10, "val_loss": 2.5, "val_domains": {"literature": 2.25, "web": 3}}
    assert scalars(record) == {"eval/val_loss": 2.5, "eval/val_domains/literature": 2.25, "eval/val_domains/web": 3}
    assert scalars({"type": "device", "step": 0, "peak": 1.0}) == {}


def test_a_missing_tracker_package_is_refused_before_the_run_starts(tiny_shards, tmp_path, monkeypatch):
    import accelerate.tracking

    monkeypatch.setattr(accelerate.tracking, "_available_trackers",
                        [t for t in accelerate.tracking.get_available_trackers() if str(t) != "tensorboard"])
    with pytest.raises(UsageError, match=r"hitoban\[tensorboard\]"):
        pretrain(night_config(tiny_shards, tmp_path / "run", report_to="tensorboard"))
    assert not (tmp_path / "run").exists()  # nothing was started or written


def _tensorboard_scalars(folder) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0}).Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def test_tensorboard_and_trackio_get_log_jsonls_numbers_and_a_resume_continues_them(tiny_shards, tmp_path):
    from trackio.sqlite_storage import SQLiteStorage

    run = tmp_path / "run"
    pretrain(night_config(tiny_shards, run, steps=10, report_to="tensorboard,trackio"))
    # the resume: the same run, extended to 20 steps; its records go to the same tracker runs
    pretrain(night_config(tiny_shards, run, steps=20, report_to="tensorboard,trackio", allow_change="total_steps"))
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    expected: dict[str, dict[int, float]] = {}
    for record in records:
        for key, value in scalars(record).items():
            expected.setdefault(key, {})[record["step"]] = value
    assert sorted(expected["train/loss"]) == [5, 10, 15, 20] and sorted(expected["eval/val_loss"]) == [10, 20]
    assert {"train/lr", "train/grad_norm", "train/tok_per_sec", "train/mfu", "eval/val_domains/literature"} <= set(
        expected)

    board = _tensorboard_scalars(run / "tensorboard")  # one TensorBoard run for both sessions
    assert set(board) == set(expected)
    for key, by_step in expected.items():
        assert sorted(board[key]) == sorted(by_step), key
        for step, value in by_step.items():  # TensorBoard keeps float32
            assert board[key][step] == pytest.approx(value, rel=1e-6, abs=1e-12), (key, step)

    run_id = json.loads((run / "config.json").read_text())["run_id"]
    runs = [name for name in SQLiteStorage.get_runs("hitoban") if name.endswith(run_id[:8])]
    assert runs == [f"run-{run_id[:8]}"]  # one trackio run, continued by the resume
    logged = SQLiteStorage.get_logs("hitoban", runs[0])
    got: dict[str, dict[int, float]] = {}
    for row in logged:
        for key, value in row.items():
            if key not in ("step", "timestamp"):
                got.setdefault(key, {})[row["step"]] = value
    assert got == expected  # float64 both sides: equal
    config = SQLiteStorage.get_run_config("hitoban", runs[0])
    assert config["lr"] == night_config(tiny_shards, run).lr and config["run_id"] == run_id
    assert json.loads((run / "trackers.json").read_text())["report_to"] == ["tensorboard", "trackio"]


def test_without_report_to_nothing_is_written_for_a_tracker(tiny_shards, tmp_path):
    run = tmp_path / "run"
    pretrain(night_config(tiny_shards, run, steps=5, eval_every=100))
    assert not (run / "tensorboard").exists() and not (run / "trackers.json").exists()


def test_the_trainer_verbs_refuse_an_unknown_or_missing_tracker_before_reading_anything(tmp_path, monkeypatch):
    import accelerate.tracking

    from hitoban.training.finetune.options import FinetuneOptions
    from hitoban.training.finetune.sft import finetune

    with pytest.raises(UsageError, match="--report-to"):
        FinetuneOptions(base="b", data=["d"], out="o", report_to="tensorbord")
    monkeypatch.setattr(accelerate.tracking, "_available_trackers", [])
    options = FinetuneOptions(base=str(tmp_path / "missing-base"), data=[str(tmp_path / "none.jsonl")],
                              out=str(tmp_path / "out"), report_to="wandb")
    with pytest.raises(UsageError, match=r"hitoban\[wandb\]"):
        finetune(options, log=lambda *_: None)
    assert not (tmp_path / "out").exists()


def test_a_resume_stores_the_config_again_only_where_the_tracker_allows_it(tmp_path):
    """MLflow refuses to change a logged param (a resume with --allow-change total_steps stopped there, found by a
    run against a real MLflow store) and TensorBoard adds a run per hparams call: only W&B and trackio update."""
    from hitoban.training.trackers import RunTrackers

    class Recorder:
        def __init__(self, name):
            self.name, self.calls = name, []

        def start(self):
            self.calls.append("start")

        def store_init_configuration(self, values):
            self.calls.append("config")

    for resumed, expected in ((None, {"tensorboard", "mlflow", "wandb", "trackio"}), (7, {"wandb", "trackio"})):
        trackers = RunTrackers([], tmp_path, "run", "0" * 32, resumed)
        trackers.trackers = [Recorder(n) for n in ("tensorboard", "mlflow", "wandb", "trackio")]
        for tracker in trackers.trackers:
            if tracker.name == "mlflow":
                tracker.tracker = type("Run", (), {"info": type("Info", (), {"run_id": "abc"})})()
        trackers.start({"lr": 1e-3})
        assert {t.name for t in trackers.trackers if "config" in t.calls} == expected
        assert json.loads((tmp_path / "trackers.json").read_text())["mlflow_run_id"] == "abc"


def offline_trackers(monkeypatch, root) -> None:
    """W&B in offline mode and MLflow on a local sqlite store, with their home folders and telemetry kept in the
    test: nothing of theirs reaches the network (CI has none) or the user's ~/.config."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(root / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")


@pytest.mark.slow  # two tiny nights and a W&B service process: 80 s on 2 busy cores (wandb, mlflow-skinny: [dev])
def test_wandb_offline_and_mlflow_continue_the_same_run_across_a_resume(tiny_shards, tmp_path, monkeypatch):
    import mlflow

    offline_trackers(monkeypatch, tmp_path)
    run = tmp_path / "run"
    pretrain(night_config(tiny_shards, run, steps=10, report_to="wandb,mlflow"))
    pretrain(night_config(tiny_shards, run, steps=20, report_to="wandb,mlflow", allow_change="total_steps"))
    losses = {r["step"]: r["loss"] for r in map(json.loads, (run / "log.jsonl").read_text().splitlines())
              if r["type"] == "train"}
    client = mlflow.tracking.MlflowClient()
    run_id = json.loads((run / "trackers.json").read_text())["mlflow_run_id"]
    assert {m.step: m.value for m in client.get_metric_history(run_id, "train/loss")} == losses
    assert len(client.search_runs([client.get_experiment_by_name("hitoban").experiment_id])) == 1
    sessions = sorted((run / "wandb").glob("offline-run-*"))
    hitoban_run_id = json.loads((run / "config.json").read_text())["run_id"]
    assert len(sessions) == 2 and all(s.name.endswith(hitoban_run_id) for s in sessions)  # one W&B run id
