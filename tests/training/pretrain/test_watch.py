"""`hitoban watch` (training/pretrain/watch.py): progress, a stale heartbeat, a finished run."""

from __future__ import annotations

import json

from hitoban.cli import main
from hitoban.training.pretrain.watch import render


def test_watch_renders_progress_stale_and_finished_states(tmp_path):
    assert "waiting" in render(tmp_path)
    beat = {"updated_at": 1000.0, "step": 50, "total_steps": 200, "tokens_seen": 5000, "token_budget": 20000,
            "train_loss": 5.5, "best_val": None, "lr": 3e-4, "tok_per_sec": 1200.0, "elapsed_hours": 0.5,
            "eta_hours": 1.5, "peak_gb": None, "resumes": 1, "finished": False, "stop_reason": None}
    (tmp_path / "heartbeat.json").write_text(json.dumps(beat))
    screen = render(tmp_path, now=1010.0)
    assert "25.0%" in screen and "not measured yet" in screen and "ETA 1.50 h" in screen and "resumes 1" in screen
    assert "may have crashed" in render(tmp_path, now=1000.0 + 600)
    (tmp_path / "heartbeat.json").write_text(json.dumps({**beat, "finished": True, "stop_reason": "budget"}))
    assert "finished: budget" in render(tmp_path, now=5000.0)
    assert main(["watch", str(tmp_path), "--once"]) == 0


def test_watch_renders_a_federated_run_with_the_same_view(tmp_path):
    """One renderer for both kinds: a federated heartbeat gets the bar, tokens, its machines, ETA and status."""
    beat = {"kind": "federated-heartbeat", "schema": 1, "round": 3, "tokens_seen": 1600, "token_budget": 6400,
            "machines": {"a": {"tok_s": 2500.0, "windows": 25, "tasks": 3, "lost_tasks": 1}}, "reissued": 1,
            "bytes_sent": 2**21, "train_loss": 6.0, "best_val": 6.25, "eta_hours": 0.5, "elapsed_hours": 0.2,
            "resumes": 0, "finished": False, "updated_at": 1000.0}
    (tmp_path / "heartbeat.json").write_text(json.dumps(beat))
    screen = render(tmp_path, now=1010.0)
    assert "25.0%  round 3" in screen and "tokens 1,600 / 6,400" in screen and "val loss 6.2500" in screen
    assert "2.0 MiB" in screen and "a                    2.5k tok/s" in screen and "ETA 0.50 h" in screen
    assert "updated 10 s ago" in screen and "waiting for a machine's lease" in render(tmp_path, now=1000.0 + 600)
    (tmp_path / "heartbeat.json").write_text(json.dumps({**beat, "finished": True}))
    assert render(tmp_path, now=5000.0).splitlines()[-1] == "finished"
