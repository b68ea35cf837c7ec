"""What a night can afford (training/pretrain/budget.py): --hours from a measurement of the night's own
micro-batch, and the memory preflight against free memory and --memory-cap-gb."""

from __future__ import annotations

import json

import pytest
from conftest import night_config

from hitoban.errors import ResourceError
from hitoban.training.pretrain.checkpoint import current_slot
from hitoban.training.pretrain.options import PretrainConfig
from hitoban.training.pretrain.trainer import pretrain


def test_memory_preflight_refuses_impossible_runs(tiny_shards, tmp_path):
    with pytest.raises(MemoryError, match="lower --batch-size"):
        pretrain(night_config(tiny_shards, tmp_path / "run", preset="3lm", batch_size=100_000, context=64))


def test_the_memory_estimate_counts_the_fp32_logits_and_the_cap_is_the_limit(tiny_shards, tmp_path):
    from hitoban.modeling import HitobanConfig
    from hitoban.training.pretrain.budget import estimate_memory_bytes
    from hitoban.training.pretrain.trainer import pretrain

    config = HitobanConfig.from_preset("3lm", vocab_size=32000)
    b, t, v = 32, config.max_position_embeddings, 32000
    extra = estimate_memory_bytes(config, b, t, "bf16") - estimate_memory_bytes(config, b, t, "no")
    assert extra == b * t * v * 4  # the half logits and gradient (2 + 2) beside fp32's three copies: one more fp32
    assert estimate_memory_bytes(config, b, t, "no") > b * t * v * 12  # fp32: logits, log-softmax and gradient
    with pytest.raises(ResourceError, match=r"allowed by --memory-cap-gb"):
        pretrain(PretrainConfig(data=str(tiny_shards), out=str(tmp_path / "r"), preset="tiny", context=64,
                                batch_size=8, steps=2, progress=False, cpu=True, memory_cap_gb=0.01))


def test_hours_measures_the_micro_batch_the_night_will_run(tiny_shards, monkeypatch):
    from accelerate import Accelerator

    from hitoban.training import night
    from hitoban.training.pretrain import calibrate
    from hitoban.training.step import reset_accelerate_state

    seen = []
    real = night.update

    def spy(model, optimizer, accelerator, rows, lr, dropout_seed, grad_accum, grad_clip):
        seen.append(len(rows) // grad_accum)
        return real(model, optimizer, accelerator, rows, lr, dropout_seed, grad_accum, grad_clip)

    monkeypatch.setattr(night, "update", spy)
    reset_accelerate_state(cpu=True)
    try:
        calibrate.measure("tiny", 8, 4000, 32, steps=2, warmup=1, accelerator=Accelerator(cpu=True), grad_accum=4,
                          max_seconds=5)
    finally:
        reset_accelerate_state()
    assert set(seen) == {2}  # 8 rows in 4 micro-batches of 2, as the night with --grad-accum 4 runs them


@pytest.mark.slow  # ~15-40 s (two --hours measurements): keeps the fast tier under 3 minutes
def test_hours_sizes_the_budget_by_measurement_and_a_resume_keeps_it(tiny_shards, tmp_path, capsys):
    run = tmp_path / "run"
    cfg = PretrainConfig(**{**night_config(tiny_shards, run).__dict__, "steps": None, "hours": 0.03,
                            "eval_every": 10**6, "max_hours": 1e-9})  # ~100 s from its start, stopped after a step
    pretrain(cfg)
    out = capsys.readouterr().out
    budget = json.loads((current_slot(run) / "train_state.json").read_text())["fingerprint"]["total_steps"]
    assert "tok/s measured ->" in out and budget > 1
    pretrain(PretrainConfig(**{**cfg.__dict__, "hours": 5.0}))  # a resume never re-sizes (and stops after a step)
    assert f"keeping this run's budget of {budget:,} steps" in capsys.readouterr().out
    state = json.loads((current_slot(run) / "train_state.json").read_text())
    assert state["step"] == 2 and state["fingerprint"]["total_steps"] == budget
    with pytest.raises(ValueError, match="exactly one of --tokens, --steps or --hours"):
        pretrain(PretrainConfig(**{**cfg.__dict__, "steps": 5}))


def test_hours_counts_from_the_nights_start(tiny_shards, tmp_path, monkeypatch):
    """--hours 1 means the night ends an hour after it started: the minutes already spent reading the shards,
    building the model and measuring come off the budget (a hand computation; a night started an hour ago gets 1
    step)."""
    import time
    from types import SimpleNamespace

    from hitoban.training.pretrain import budget

    monkeypatch.setattr(budget, "measure", lambda *a, **k: {"tok_per_sec": 1000.0})
    accelerator = SimpleNamespace(num_processes=1, device="cpu")
    train = SimpleNamespace(vocab_size=4000)
    cfg = PretrainConfig(**{**night_config(tiny_shards, tmp_path / "run").__dict__, "steps": None, "hours": 1.0})
    started = time.time() - 600  # ten minutes ago
    steps = budget.steps_for_hours(cfg, tmp_path / "run", accelerator, train, 64, False, started=started)
    spent = time.time() - started
    expected = int(1000.0 * (3600 - spent) * budget.HOURS_USABLE) // (cfg.batch_size * 64)
    assert abs(steps - expected) <= 1 and steps < int(1000.0 * 3600 * budget.HOURS_USABLE) // (cfg.batch_size * 64)
    assert budget.steps_for_hours(cfg, tmp_path / "run", accelerator, train, 64, False,
                                  started=time.time() - 3600) == 1  # the hour is gone already
