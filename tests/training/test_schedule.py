"""The LR schedule (training/schedule.py): 3LM's recorded values, and WSD by hand (docs/design.md §6)."""

from __future__ import annotations

import pytest

from hitoban.training.schedule import Schedule


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
