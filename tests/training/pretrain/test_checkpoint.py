"""Crash-safe A/B checkpoints (training/pretrain/checkpoint.py): a failed save keeps the previous slot."""

from __future__ import annotations

import errno
import json

import pytest
from conftest import night_config

from hitoban.training.pretrain import checkpoint as checkpoint_module
from hitoban.training.pretrain.checkpoint import CheckpointError
from hitoban.training.pretrain.trainer import pretrain


def test_a_failed_save_keeps_the_previous_slot_and_current(tiny_shards, tmp_path, monkeypatch):
    run = tmp_path / "run"
    real_save_file, calls = checkpoint_module.save_file, {"n": 0}

    def disk_full_on_second_save(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save_file(*args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "save_file", disk_full_on_second_save)
    with pytest.raises(CheckpointError, match="No space left on device; the last good checkpoint \\(ckpt-A\\)"):
        pretrain(night_config(tiny_shards, run, steps=20, save_every_steps=5, eval_every=1000))
    assert (run / "CURRENT").read_text().strip() == "ckpt-A"
    assert json.loads((run / "ckpt-A" / "train_state.json").read_text())["step"] == 5
    assert not (run / "ckpt-B").exists()  # no half-written slot left behind
