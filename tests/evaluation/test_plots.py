"""A run's figures (evaluation/plots.py)."""

from __future__ import annotations

import json

import pytest


def test_plot_run_draws_loss_curves_and_resumes(tmp_path):
    from hitoban.evaluation.plots import plot_run

    run = tmp_path / "run"
    run.mkdir()
    records = [{"type": "train", "step": s, "loss": 9 - s / 10} for s in range(5, 55, 5)]
    records += [{"type": "resume", "step": 20, "resumes": 1},
                {"type": "eval", "step": 50, "val_loss": 4.2, "val_domains": {"web": 4.0, "aozora": 4.5}}]
    (run / "log.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    paths = plot_run(run)
    assert [p.name for p in paths] == ["loss.png"] and paths[0].stat().st_size > 10_000
    with pytest.raises(FileNotFoundError, match="no training log"):
        plot_run(tmp_path)
