"""The LR schedule (training/schedule.py): 3LM's recorded values, and WSD by hand (docs/design.md §6)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hitoban.training.schedule import Schedule, ScheduleOptions


def lr_at(step: int, total: int, peak: float, schedule: str = "cosine") -> float:
    return Schedule(peak, total, schedule).lr(step)


def test_lr_schedule_matches_3lm_recorded_values():
    total = 22_437  # 3LM's night: warmup 448
    assert abs(lr_at(50, total, 6e-4) - 7.7625e-5) < 1e-12
    assert abs(lr_at(448, total, 6e-4) - 6e-4) < 1e-12
    assert abs(lr_at(total, total, 6e-4) - 6e-5) < 1e-12
    values = [lr_at(s, total, 6e-4) for s in range(0, total + 1, 100)]
    peak = values.index(max(values))
    assert values[:peak] == sorted(values[:peak]) and values[peak:] == sorted(values[peak:], reverse=True)


def test_wsd_schedule_by_hand():
    """1,000 steps, peak 1e-3, warmup max(100, 2%) = 100, warmdown the last 20% = steps 800..1000, floor 1e-4."""
    assert lr_at(0, 1000, 1e-3, schedule="wsd") == pytest.approx(2e-5)  # warmup starts at 2% of the peak
    assert lr_at(100, 1000, 1e-3, schedule="wsd") == 1e-3
    assert lr_at(799, 1000, 1e-3, schedule="wsd") == 1e-3  # stable
    assert lr_at(900, 1000, 1e-3, schedule="wsd") == pytest.approx(5.5e-4)  # halfway down: (1e-3 + 1e-4) / 2
    assert lr_at(1000, 1000, 1e-3, schedule="wsd") == pytest.approx(1e-4)
    # extending a night: before the old warmdown the new schedule is the same curve
    assert [lr_at(s, 1000, 1e-3, schedule="wsd") for s in range(0, 800)] == \
        [lr_at(s, 2000, 1e-3, schedule="wsd") for s in range(0, 800)]
    assert lr_at(500, 1000, 1e-3) < 1e-3  # cosine, by contrast, is already decaying


@settings(max_examples=200, deadline=None)
@given(total=st.integers(2, 30_000), frac=st.floats(0, 1), floor=st.integers(0, 2_000),
       kind=st.sampled_from(["cosine", "wsd"]))
def test_the_warmup_is_the_longer_of_its_two_options(total, frac, floor, kind):
    """--warmup-steps is a floor the user sets (a short run can lower it), --warmup-frac a share of the steps; the
    warmup is the longer, at most all but one step; it climbs linearly from 2% of the peak to the peak."""
    options = ScheduleOptions(schedule=kind, warmup_frac=frac, warmup_steps=floor)
    schedule = options.schedule_for(1.0, total)
    expected = min(max(floor, math.floor(total * frac)), total - 1)
    assert schedule.warmup == expected
    if expected:
        assert schedule.lr(0) == pytest.approx(0.02)
        assert schedule.lr(expected // 2) == pytest.approx(0.02 + 0.98 * (expected // 2) / expected)
    assert schedule.lr(expected) == pytest.approx(1.0)  # the peak, where the warmup ends


def test_a_short_run_can_lower_the_warmup_floor(tiny_shards, tmp_path):
    """On the real night: 20 steps with --warmup-steps 0 --warmup-frac 0.1 warm up over 2 steps, where the default
    floor (the negative control) stretches the warmup over the whole run. Update k runs at lr(k - 1)."""
    from conftest import night_config

    from hitoban.training.pretrain.trainer import pretrain

    lr = {}
    for name, floor in (("lowered", 0), ("default", 100)):
        run = tmp_path / name
        pretrain(night_config(tiny_shards, run, lr=3e-3, steps=20, warmup_frac=0.1, warmup_steps=floor, log_every=1,
                              schedule="cosine", eval_every=1000))
        records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        lr[name] = {r["step"]: r["lr"] for r in records if r["type"] == "train"}
    lowered = Schedule(3e-3, 20, "cosine", warmup_frac=0.1, warmup_steps=0)
    assert lowered.warmup == 2
    assert lr["lowered"] == pytest.approx({step: lowered.lr(step - 1) for step in range(1, 21)})
    assert lr["lowered"][3] == pytest.approx(3e-3)  # the peak after two steps of warmup
    assert lr["default"][3] < 3e-3 / 5  # the default floor: still warming up, as it is until the last step
