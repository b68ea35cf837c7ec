"""`hitoban calibrate` (training/pretrain/calibrate.py): real steps per candidate, D/N closest to 20."""

from __future__ import annotations

from hitoban.training.pretrain.calibrate import calibrate
from hitoban.training.pretrain.options import CalibrateOptions


def test_calibrate_measures_candidates_and_picks_d_over_n_near_20(tiny_shards):
    options = CalibrateOptions(candidate=["tiny:4", "tiny:8"], hours=0.01, data=str(tiny_shards), steps=2, warmup=1,
                               cpu=True, max_seconds=3)  # a busy machine's unsettled timings stop here
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


def test_candidates_that_do_not_fit_are_listed_and_skipped_and_none_fitting_is_an_error(tiny_shards):
    """Issue 34: the default candidates include 3lm:48 and zxell-s:16, which a 12 GB card cannot hold; measured,
    they died with out-of-memory and nothing was written. Each candidate's estimate is held against the cap: the
    ones over it are listed as not fitting, not measured."""
    import pytest

    from hitoban.errors import ResourceError
    from hitoban.training.data.reader import ShardReader
    from hitoban.training.hardware import plan_for
    from hitoban.training.pretrain.budget import estimate_memory_bytes
    from hitoban.training.pretrain.options import shaped_config

    config, context = shaped_config("tiny", ShardReader(tiny_shards).vocab_size)
    need = {b: estimate_memory_bytes(config, b, context, plan_for("cpu").precision) for b in (4, 64)}
    cap = (need[4] + need[64]) / 2 / 0.9 / 2**30  # tiny:4 fits, tiny:64 does not
    options = CalibrateOptions(candidate=["tiny:4", "tiny:64"], hours=0.01, data=str(tiny_shards), steps=1,
                               warmup=0, cpu=True, memory_cap_gb=cap)
    result = calibrate(options, log=lambda *_: None)
    assert [r["label"] for r in result["results"]] == ["tiny b4"]
    assert [r["label"] for r in result["skipped"]] == ["tiny b64"]
    assert result["skipped"][0]["estimate_gb"] > result["skipped"][0]["limit_gb"] * 0.9
    with pytest.raises(ResourceError, match="none of the candidates fits"):
        calibrate(CalibrateOptions(**{**options.__dict__, "candidate": ["tiny:64"]}), log=lambda *_: None)


def test_timing_goes_on_while_the_spread_is_over_10_percent_and_stops_at_max_seconds():
    """A step whose time alternates 1x/3x never settles: timing stops at the deadline, not at --steps; a steady step
    stops at --steps. Control: the steady step's spread is under STABLE_SPREAD, the alternating one's over it."""
    import time

    import torch

    from hitoban.training.pretrain.calibrate import STABLE_SPREAD, _spread, time_steps

    calls = []

    def step(_index: int, pause: float) -> None:
        calls.append(pause)
        time.sleep(pause)

    started = time.perf_counter()
    unsettled = time_steps(lambda i: step(i, 0.01 if i % 2 else 0.03), 0, 4, torch.device("cpu"), max_seconds=0.5)
    took = time.perf_counter() - started
    assert 0.5 <= took < 1.5 and len(unsettled) > 4 and _spread(unsettled) > STABLE_SPREAD
    steady = time_steps(lambda i: step(i, 0.05), 0, 4, torch.device("cpu"), max_seconds=30)
    assert len(steady) == 4 and _spread(steady) <= STABLE_SPREAD


def test_a_refused_option_prints_nothing_before_its_one_line(tiny_shards, capsys):
    """calibrate checks its options before printing its table's header (it printed the header, then refused)."""
    from hitoban.cli import main

    try:
        code = main(["calibrate", "--data", str(tiny_shards), "--max-seconds", "0"])
    except SystemExit as exit_:
        code = exit_.code
    printed = capsys.readouterr()
    assert code == 2 and printed.out == ""
    assert printed.err.strip().splitlines() == ["hitoban calibrate: error: --max-seconds 0: must be above 0"]
