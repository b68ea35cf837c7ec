"""Where a resume puts the restored optimizer state (training/pretrain/resume.py): fused AdamW's on its
parameter's device."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hitoban.training.optim import AdamW
from hitoban.training.pretrain.checkpoint import CheckpointError
from hitoban.training.pretrain.options import PretrainConfig
from hitoban.training.pretrain.trainer import pretrain


def _fused_adamw_with_state(param_device: str, step_device: str):

    param = torch.nn.Parameter(torch.zeros(3, device=param_device))
    optimizer = AdamW([param])
    optimizer.state[param] = {"step": torch.tensor(5.0, device=step_device),
                              "exp_avg": torch.zeros(3, device=param_device),
                              "exp_avg_sq": torch.zeros(3, device=param_device)}
    return param, optimizer


def test_after_a_resume_a_fused_groups_state_sits_on_its_parameters_device():
    """A 'meta' parameter stands in for a GPU one: the state that resume used to leave on the CPU is found."""
    from hitoban.training.optim import place_step_counters
    from hitoban.training.pretrain.resume import check_state_placement

    param, optimizer = _fused_adamw_with_state("meta", "cpu")  # what `step.cpu()` after prepare() left
    with pytest.raises(CheckpointError, match=r"'step' of a \(3,\) parameter is on cpu"):
        check_state_placement(optimizer)
    place_step_counters(optimizer)
    check_state_placement(optimizer)
    assert optimizer.state[param]["step"].device.type == "meta"
    # a plain (for-each) group keeps `step` on the CPU, where reading it costs no device sync
    plain = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3, device="meta"))], foreach=False)
    p = plain.param_groups[0]["params"][0]
    plain.state[p] = {"step": torch.tensor(5.0), "exp_avg": torch.zeros(3, device="meta")}
    place_step_counters(plain)
    assert plain.state[p]["step"].device.type == "cpu"
    check_state_placement(plain)
    plain.state[p]["step"] = torch.zeros((), device="meta")  # a plain group's counter on the device: a sync a step
    with pytest.raises(CheckpointError, match="reads it on cpu"):
        check_state_placement(plain)


def test_a_real_resume_passes_the_placement_check_and_a_fused_state_is_fused(tiny_shards, tmp_path):
    from hitoban.training.pretrain.resume import check_state_placement
    from hitoban.training.pretrain.trainer import Trainer

    cfg = PretrainConfig(data=str(tiny_shards), out=str(tmp_path / "run"), preset="tiny", context=64, batch_size=8,
                         steps=4, eval_every=100, progress=False, cpu=True, compile="off", optimizer="adamw",
                         max_hours=1e-9)
    pretrain(cfg)
    run = Trainer(dataclasses.replace(cfg, max_hours=None))
    try:
        assert run.resumed_from is not None and run.optimizer.param_groups[0]["fused"]
        check_state_placement(run.optimizer)
    finally:
        from hitoban.training.step import reset_accelerate_state

        run.close()
        reset_accelerate_state()
