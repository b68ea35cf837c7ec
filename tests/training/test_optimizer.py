"""The optimizer component's options (training/optimizer.py): the learning rate is declared, defaulted and resolved
here once, and `optimizer_for` builds what the options say."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hitoban.modeling import HitobanConfig, HitobanForCausalLM
from hitoban.training.optim import Hybrid
from hitoban.training.optimizer import DEFAULT_LR, PRESET_LR, OptimizerOptions, default_lr
from hitoban.training.schedule import Schedule, ScheduleOptions


@pytest.mark.parametrize("optimizer, preset", [("muon", "small"), ("muon", "3lm"), ("adamw", "small"),
                                               ("adamw", "tiny")])
def test_the_lr_a_run_gets_without_one(optimizer, preset):
    options = OptimizerOptions(optimizer=optimizer)
    options.resolve_lr(preset)
    assert options.lr == PRESET_LR.get((optimizer, preset), DEFAULT_LR[optimizer]) == default_lr(optimizer, preset)
    given = OptimizerOptions(optimizer=optimizer, lr=1e-3)
    given.resolve_lr(preset)
    assert given.lr == 1e-3  # a given lr is never replaced


def test_the_night_options_resolve_the_lr_once_from_the_component():
    from hitoban.training.pretrain.options import TrainingOptions

    assert TrainingOptions(data="d", preset="small").lr == 8e-3
    assert TrainingOptions(data="d", preset="3lm", optimizer="adamw").lr == 6e-4
    fields = {f.name: f for f in dataclasses.fields(TrainingOptions)}
    assert fields["lr"] is not None and OptimizerOptions.__dataclass_fields__["lr"].metadata == fields["lr"].metadata


def test_optimizer_for_builds_what_the_options_say():
    model = HitobanForCausalLM(HitobanConfig.from_preset("tiny", vocab_size=300))
    adamw = OptimizerOptions(optimizer="adamw", lr=1e-3, weight_decay=0.05).optimizer_for(model, 2e-5, "float32")
    assert isinstance(adamw, torch.optim.AdamW) and adamw.param_groups[0]["lr"] == 2e-5
    assert adamw.param_groups[0]["weight_decay"] == 0.05
    muon = OptimizerOptions(optimizer="muon", lr=1e-3).optimizer_for(model, 2e-5, "float32")
    assert isinstance(muon, Hybrid) and {g["lr"] for g in muon.param_groups} == {2e-5}


def test_schedule_for_is_the_schedule_of_the_options():
    options = ScheduleOptions(schedule="cosine", warmup_frac=0.1, min_lr_ratio=0.2, decay_frac=0.3)
    assert options.schedule_for(1e-3, 500) == Schedule(1e-3, 500, "cosine", 0.1, 0.2, 0.3)
    with pytest.raises(Exception, match="--warmup-frac"):
        ScheduleOptions(warmup_frac=2.0)


def test_lr_help_is_written_from_the_defaults_table(monkeypatch):
    """--lr's default lives in one table; the help is made from it (a changed default cannot leave the help stale)."""
    from hitoban.training import optimizer

    help_text = optimizer.OptimizerOptions.__dataclass_fields__["lr"].metadata["help"]
    assert all(f"{lr:g}" in help_text for lr in (*optimizer.DEFAULT_LR.values(), *optimizer.PRESET_LR.values()))
    monkeypatch.setitem(optimizer.PRESET_LR, ("muon", "small"), 5e-3)  # negative control: a new default, new help
    assert "0.005 at the small preset" in optimizer._lr_help()
