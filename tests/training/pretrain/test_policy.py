"""The checkpoint policy (training/pretrain/policy.py): one decision for every process, on the host."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import launch_hitoban

from hitoban.training.pretrain.checkpoint import current_slot


def test_a_shared_decision_over_several_processes_never_waits_for_the_device(monkeypatch):
    """The per-step decision (deadline, signal, save time) used to be a device tensor read back with .tolist(): a
    host sync with the GPU every step. It travels on the host now (gloo). A 'meta' device stands in for the GPU."""
    import torch.distributed as dist

    from hitoban.training.pretrain import policy as loop

    seen = []

    def all_reduce(tensor, op=None, group=None):
        seen.append(tensor.device.type)
        tensor[1] = 1.0  # another rank was signalled

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(loop, "host_group", lambda: None)

    class TwoRanks:
        num_processes = 2
        device = torch.device("meta")

    policy = loop.CheckpointPolicy(None, 60.0, None, 20)
    assert policy.after_step(3, 0.0, TwoRanks()) and policy.stop_reason == "signal (another process)"
    assert seen == ["cpu"]


@pytest.mark.slow
def test_ranks_with_skewed_clocks_stop_together(tiny_shards, tmp_path):
    """Each rank used to decide --max-hours from its own clock: rank 1 (clock 28 h ahead) stopped and saved while
    rank 0 went on training, and both waited forever in different collectives. The decision is now shared."""
    from hitoban.training import faults

    args = ["pretrain", "--data", str(tiny_shards), "--preset", "tiny", "--context", "64", "--steps", "12",
            "--batch-size", "8", "--eval-every", "100", "--no-progress", "--cpu", "--max-hours", "1",
            "--out", str(tmp_path / "skewed")]
    done = launch_hitoban(args, 2, tmp_path, timeout=240, **faults.to_env(clock_skew=(1, 100000)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((current_slot(tmp_path / "skewed") / "train_state.json").read_text())["step"] == 1
    assert "pretrain stopped (max_hours) at step 1/12" in done.stdout
