"""`hitoban calibrate` (training/pretrain/calibrate.py): real steps per candidate, D/N closest to 20."""

from __future__ import annotations

from hitoban.training.pretrain.calibrate import calibrate
from hitoban.training.pretrain.options import CalibrateOptions


def test_calibrate_measures_candidates_and_picks_d_over_n_near_20(tiny_shards):
    options = CalibrateOptions(candidate=["tiny:4", "tiny:8"], hours=0.01, data=str(tiny_shards), steps=2, warmup=1,
                               cpu=True)
    result = calibrate(options, log=lambda *_: None)
    assert [r["label"] for r in result["results"]] == ["tiny b4", "tiny b8"]
    for row in result["results"]:
        assert row["tok_per_sec"] > 0 and row["tokens_in_budget"] == int(row["tok_per_sec"] * 36 * 0.9)
        assert row["d_over_n"] == row["tokens_in_budget"] / row["non_embedding"]
        assert row["steps_timed"] >= 2 and row["spread"] >= 0  # per-step times: median and interquartile range
        assert row["tok_per_sec_range"][0] <= row["tok_per_sec"] <= row["tok_per_sec_range"][1]
    best = min(result["results"], key=lambda r: abs(r["d_over_n"] - 20))
    assert result["selected"] == best["label"] and f"--tokens {best['tokens_in_budget']}" in result["command"]
    assert "so the night holds" in result["sureness"]
