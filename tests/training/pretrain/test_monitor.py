"""The monitor's NaN guard and host reads (training/pretrain/monitor.py): a non-finite loss is caught at the
next log step or save, never saved, on every rank at once; the device is read once per log window."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import EXACT, launch_hitoban, night_config
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from hitoban.training.pretrain.checkpoint import current_slot
from hitoban.training.pretrain.monitor import TrainingDiverged
from hitoban.training.pretrain.trainer import pretrain


def _count_host_reads(monkeypatch) -> dict:
    counts = {"n": 0}
    for name in ("item", "__float__", "__bool__", "tolist", "__int__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            counts["n"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts


@pytest.mark.slow
def test_the_loop_reads_the_device_once_per_log_window_not_every_step(tiny_shards, tmp_path, monkeypatch):
    counts = _count_host_reads(monkeypatch)
    reads = {}
    for steps, log_every in ((10, 10), (20, 10), (10, 1), (20, 1)):
        counts["n"] = 0
        pretrain(night_config(tiny_shards, tmp_path / f"r{steps}-{log_every}", **EXACT, steps=steps,
                              log_every=log_every, eval_every=1000))
        reads[(steps, log_every)] = counts["n"]
    # 10 more steps with one more log window cost a handful of reads, not 10
    assert reads[(20, 10)] - reads[(10, 10)] <= 6, reads
    # negative control: logging every step reads every step, and the counter sees it
    assert reads[(20, 1)] - reads[(10, 1)] >= 10, reads


def test_a_nan_between_saves_is_caught_at_the_next_log_step(tiny_shards, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match=r"between steps 1 and 5 .*no checkpoint had been written yet"):
        pretrain(night_config(tiny_shards, run, **EXACT, lr=1e12, grad_clip=0.0, log_every=5, eval_every=1000))
    assert current_slot(run) is None  # nothing past the NaN was saved
    assert json.loads((run / "heartbeat.json").read_text())["stop_reason"] == "nan"


def test_a_nan_is_never_saved_and_the_run_resumes_from_the_last_good_slot(tiny_shards, tmp_path):
    run = tmp_path / "run"
    good = night_config(tiny_shards, run, **EXACT, log_every=1000, save_every_steps=3, eval_every=1000)
    pretrain(dataclasses.replace(good, max_hours=1e-9))  # stops, saved, after step 1
    with pytest.raises(TrainingDiverged, match=r"last good checkpoint \(step 1\) is untouched and the run resumes"):
        pretrain(dataclasses.replace(good, lr=1e12, adamw_lr=1e12, grad_clip=0.0, allow_change="lr,adamw_lr,grad_clip"))
    assert json.loads((run / "heartbeat.json").read_text())["stop_reason"] == "nan"
    slot = current_slot(run)
    assert json.loads((slot / "train_state.json").read_text())["step"] == 1
    assert all(torch.isfinite(t).all() for t in load_file(str(slot / "model.safetensors")).values())
    assert pretrain(good)["steps"] == 20  # the original options continue from the last good state


def test_an_fp16_overflow_is_a_skipped_step_not_divergence():
    from hitoban.training.pretrain.monitor import step_outcome

    assert step_outcome(2.5, 1.3, fp16=False, skipped_in_a_row=0) == "ok"
    assert step_outcome(2.5, float("inf"), fp16=True, skipped_in_a_row=0) == "skipped"  # the scaler's job
    assert step_outcome(2.5, float("inf"), fp16=True, skipped_in_a_row=20) == "diverged"  # it never recovers
    assert step_outcome(2.5, float("inf"), fp16=False, skipped_in_a_row=0) == "diverged"
    assert step_outcome(float("nan"), 1.0, fp16=True, skipped_in_a_row=0) == "diverged"


@pytest.mark.slow
def test_an_inf_loss_on_rank_one_only_stops_both_ranks_with_nothing_saved_past_it(tiny_shards, tmp_path):
    from hitoban.training import faults
    from hitoban.training.pretrain.checkpoint import current_slot

    run = tmp_path / "run"
    args = ["pretrain", "--data", str(tiny_shards), "--preset", "tiny", "--context", "64", "--steps", "20",
            "--batch-size", "8", "--log-every", "5", "--save-every-steps", "5", "--eval-every", "100",
            "--no-progress", "--cpu", "--precision", "no", "--out", str(run)]
    done = launch_hitoban(args, 2, tmp_path, timeout=240, **faults.to_env(inf_loss=(1, 7)))
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert output.count("became non-finite between steps 6 and 10") == 2, output[-3000:]  # both ranks, same words
    assert json.loads((current_slot(run) / "train_state.json").read_text())["step"] == 5


def _monitor(tmp_path, fp16: bool, device: str = "cpu"):
    from hitoban.training.pretrain.monitor import Monitor

    return Monitor(tmp_path, total_steps=100, tokens_per_step=1, token_flops=1.0, peak_flops=1.0,
                   device=torch.device(device), fp16=fp16, progress=False)


@pytest.mark.parametrize("fp16", [False, True])
def test_a_step_is_recorded_without_reading_the_device(tmp_path, fp16):
    """Issue 34: under fp16 the monitor read the loss and gradient norm on the host every step (`float(loss)`),
    making the host wait for the GPU each step. Tensors on the `meta` device have no values at all: any host read
    of them raises, so recording steps on them proves no step is read."""
    monitor = _monitor(tmp_path, fp16)
    for step in range(1, 4):
        monitor.on_step(step, torch.ones((), device="meta"), torch.ones((), device="meta"))
    assert monitor.window_steps == 3
    with pytest.raises((NotImplementedError, RuntimeError)):  # the control: reading them is what a host sync does
        float(monitor.loss_sum)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([2.5, float("inf"), float("nan")]),
                          st.sampled_from([1.0, float("inf"), float("nan")])), min_size=1, max_size=30))
def test_the_monitors_fp16_verdict_on_the_device_is_step_outcome(tmp_path_factory, steps):
    """The on-device fp16 guard against its definition, `step_outcome`, applied step by step on the host: the same
    skipped steps (logged and counted) and the same divergence."""
    from hitoban.training.pretrain.monitor import step_outcome

    run = tmp_path_factory.mktemp("monitor")
    monitor, in_a_row, expected_skips, diverged = _monitor(run, fp16=True), 0, [], False
    for step, (loss, grad) in enumerate(steps, start=1):
        outcome = step_outcome(loss, grad, True, in_a_row)
        in_a_row = in_a_row + 1 if outcome == "skipped" else 0
        diverged = diverged or outcome == "diverged"
        if outcome == "skipped":
            expected_skips.append(step)
        monitor.on_step(step, torch.tensor(loss), torch.tensor(grad))
    if diverged:
        with pytest.raises(TrainingDiverged):
            monitor.check_finite(len(steps), -1)
        return
    monitor.check_finite(len(steps), -1)
    logged = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()] if expected_skips else []
    assert [r["step"] for r in logged if r["type"] == "skip"] == expected_skips
    assert monitor.skipped_steps == len(expected_skips)
