"""Crash-safe A/B checkpoints (training/pretrain/checkpoint.py): a failed or full save keeps the previous slot, a
damaged newest slot falls back to the one before, --resume never keeps the earlier run until it has saved, and one
process trains in a run folder at a time."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import subprocess
import sys
import time

import pytest
from conftest import night_config

from hitoban.training.pretrain import checkpoint as checkpoint_module
from hitoban.training.pretrain.checkpoint import CheckpointError, current_slot
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


def test_a_full_disk_says_so_and_keeps_the_last_checkpoint(tiny_shards, tmp_path, monkeypatch):
    """safetensors reports a full disk as its own SafetensorError, not OSError: it used to end the run in that
    traceback. Issue 25."""
    from safetensors import SafetensorError

    run, real_save_file, calls = tmp_path / "run", checkpoint_module.save_file, {"n": 0}

    def full_on_second_save(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise SafetensorError("I/O error: No space left on device (os error 28)")
        return real_save_file(*args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "save_file", full_on_second_save)
    with pytest.raises(CheckpointError,
                       match=r"No space left on device; .*\(ckpt-A\) is untouched\. The disk is full: .* MiB, free"):
        pretrain(night_config(tiny_shards, run, steps=20, save_every_steps=5, eval_every=1000))
    assert (run / "CURRENT").read_text().strip() == "ckpt-A" and not (run / "ckpt-B").exists()


def test_a_damaged_newest_slot_falls_back_to_the_previous_one_and_says_so(tiny_shards, tmp_path, capsys):
    run = tmp_path / "run"
    cfg = night_config(tiny_shards, run, steps=20, save_every_steps=5, eval_every=1000)
    pretrain(cfg)
    newest = current_slot(run)
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # cut short after COMPLETE
    capsys.readouterr()
    summary = pretrain(dataclasses.replace(cfg, steps=25, allow_change="total_steps"))
    assert summary["steps"] == 25 and "is damaged" in capsys.readouterr().out
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["type"] == "resume"] == [15]  # the slot before the damaged one
    # control: with both slots damaged there is nothing to fall back to, and the message says what to do
    for slot in ("ckpt-A", "ckpt-B"):
        (run / slot / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(CheckpointError, match="no other complete checkpoint .* --resume never"):
        pretrain(dataclasses.replace(cfg, steps=30, allow_change="total_steps"))


def test_resume_never_keeps_the_earlier_run_until_the_new_one_has_saved(tiny_shards, tmp_path):
    """`--resume never` used to delete final/ and both slots before its first save: a run stopped then left
    nothing. Now the earlier run waits in previous-run/ and comes back if the new one never saved."""
    from hitoban.provenance import weights_sha256
    from hitoban.training.pretrain.monitor import TrainingDiverged

    run = tmp_path / "run"
    first = night_config(tiny_shards, run, steps=20, save_every_steps=10)
    pretrain(first)
    kept = weights_sha256(run / "final")
    with pytest.raises(TrainingDiverged):  # a new run that never saves (NaN at once)
        pretrain(night_config(tiny_shards, run, steps=20, lr=1e12, grad_clip=0.0, log_every=2, resume="never"))
    assert not (run / "CURRENT").exists() and weights_sha256(run / "previous-run" / "final") == kept
    again = pretrain(first)  # --resume auto: the earlier run is back, complete
    assert again["steps"] == 20 and weights_sha256(run / "final") == kept and not (run / "previous-run").exists()
    pretrain(night_config(tiny_shards, run, steps=10, save_every_steps=5, resume="never"))
    assert not (run / "previous-run").exists() and weights_sha256(run / "final") != kept


@pytest.mark.slow  # a `hitoban pretrain` process of its own, SIGKILLed (~7 s): the full suite runs it
def test_one_process_per_run_folder_and_a_dead_holder_never_blocks(tiny_shards, tmp_path):
    """Two `hitoban pretrain` on one --out destroyed each other's saves. The second is refused at once, naming the
    first's pid; after the first is SIGKILLed (its lock file stays) the run resumes."""
    from hitoban.training.pretrain.checkpoint import RunBusy

    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "hitoban.cli", "pretrain", "--data", str(tiny_shards), "--out",
                             str(run), "--preset", "tiny", "--context", "64", "--steps", "5000", "--batch-size", "8",
                             "--log-every", "5", "--save-every-steps", "5", "--eval-every", "100000",
                             "--no-progress", "--cpu"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and current_slot(run) is None:
            time.sleep(0.1)
        with pytest.raises(RunBusy, match=f"pid {proc.pid}"):
            pretrain(night_config(tiny_shards, run, steps=5000, save_every_steps=5, eval_every=100000))
    finally:
        proc.kill()
        proc.wait()
    assert (run / "LOCK").exists()  # the dead holder's lock file is still there
    summary = pretrain(night_config(tiny_shards, run, steps=5000, save_every_steps=5, eval_every=100000,
                                    max_hours=1e-9))
    assert summary["resumes"] >= 1 and summary["stop_reason"] == "max_hours"


def test_a_real_full_disk_keeps_the_last_checkpoint_and_says_so(tiny_shards, tmp_path):
    """The same on a real 6 MiB tmpfs: one checkpoint of the tiny night fits, the second does not."""
    disk = tmp_path / "small-disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(disk)],
                                           capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root (the SafetensorError test above runs everywhere)")
    try:
        run = disk / "run"
        with pytest.raises(CheckpointError, match=r"No space left on device; the last good checkpoint \(ckpt-A\)"):
            pretrain(night_config(tiny_shards, run, steps=20, save_every_steps=5, eval_every=1000))
        assert (run / "CURRENT").read_text().strip() == "ckpt-A" and not (run / "ckpt-B").exists()
        assert json.loads((run / "ckpt-A" / "train_state.json").read_text())["step"] == 5
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
