"""Issue 14's loop: one definition of the options, no per-step host reads, the NaN guard at log steps and saves,
the compile choice, the precision checks, and compiled runs that resume exactly."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from hitoban.errors import UsageError
from hitoban.training.checkpoint import current_slot
from hitoban.training.hardware import DeviceFacts, check_precision, choose_compile
from hitoban.training.options import PretrainConfig, TrainingOptions, add_options, from_args, to_argv
from hitoban.training.pretrain import TrainingDiverged, pretrain

TINY = dict(preset="tiny", context=64, batch_size=8, eval_batches=2, progress=False, cpu=True, save_every_min=60,
            precision="no", compile="off")


def config(data, out, **overrides) -> PretrainConfig:
    return PretrainConfig(data=str(data), out=str(out), **{**TINY, "steps": 20, **overrides})


# ------------------------------------------------------------------------------------------- one option definition
def test_the_command_line_is_built_from_the_dataclass_defaults_and_all():
    parser = argparse.ArgumentParser()
    add_options(parser, PretrainConfig)
    args = parser.parse_args(["--data", "d", "--out", "o", "--steps", "7"])
    parsed = from_args(PretrainConfig, args)
    assert parsed == PretrainConfig(data="d", out="o", steps=7)  # every default comes from the dataclass
    args = parser.parse_args(["--data", "d", "--out", "o", "--tokens", "1e6", "--no-adam-bias-correction",
                              "--no-progress", "--optimizer", "muon", "--dropout", "0.1"])
    parsed = from_args(PretrainConfig, args)
    assert (parsed.tokens, parsed.adam_bias_correction, parsed.progress, parsed.optimizer, parsed.dropout) == (
        1_000_000, False, False, "muon", 0.1)
    with pytest.raises(SystemExit):  # the budget is one of --tokens / --steps / --hours, and required
        parser.parse_args(["--data", "d", "--out", "o", "--steps", "3", "--hours", "1"])


def test_the_kill_test_gets_the_nights_exact_options_back():
    night = TrainingOptions(data="shards", preset="small", lr=1e-3, adam_bias_correction=False, optimizer="muon",
                            schedule="wsd", dropout=0.1, cpu=True, context=128)
    parser = argparse.ArgumentParser()
    add_options(parser, TrainingOptions)
    again = from_args(TrainingOptions, parser.parse_args(["--data", "shards"] + to_argv(night)))
    assert again == night
    # every trajectory option is spelled out, defaults included: a changed default cannot slip past the kill test
    argv = to_argv(TrainingOptions(data="x"))
    assert "--optimizer" in argv and "--weight-decay" in argv and "--seed" in argv and "--data" not in argv
    assert "--lr" not in argv  # unset: the run resolves it for its optimizer, as the night did
    assert to_argv(dataclasses.replace(night, lr=2e-3)) != to_argv(night)  # and a change is carried


# --------------------------------------------------------------------------------- host reads and the NaN guard
def _count_host_reads(monkeypatch) -> dict:
    counts = {"n": 0}
    for name in ("item", "__float__", "__bool__", "tolist", "__int__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            counts["n"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts


def test_the_loop_reads_the_device_once_per_log_window_not_every_step(tiny_shards, tmp_path, monkeypatch):
    counts = _count_host_reads(monkeypatch)
    reads = {}
    for steps, log_every in ((20, 20), (40, 20), (20, 1), (40, 1)):
        counts["n"] = 0
        pretrain(config(tiny_shards, tmp_path / f"r{steps}-{log_every}", steps=steps, log_every=log_every,
                        eval_every=1000))
        reads[(steps, log_every)] = counts["n"]
    # 20 more steps with one more log window cost a handful of reads, not 20
    assert reads[(40, 20)] - reads[(20, 20)] <= 6, reads
    # negative control: logging every step reads every step, and the counter sees it
    assert reads[(40, 1)] - reads[(20, 1)] >= 20, reads


def test_a_nan_between_saves_is_caught_at_the_next_log_step(tiny_shards, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match=r"between steps 1 and 5 .*no checkpoint had been written yet"):
        pretrain(config(tiny_shards, run, lr=1e12, grad_clip=0.0, log_every=5, eval_every=1000))
    assert current_slot(run) is None  # nothing past the NaN was saved
    assert json.loads((run / "heartbeat.json").read_text())["stop_reason"] == "nan"


def test_a_nan_is_never_saved_and_the_run_resumes_from_the_last_good_slot(tiny_shards, tmp_path):
    run = tmp_path / "run"
    good = config(tiny_shards, run, log_every=1000, save_every_steps=3, eval_every=1000)
    pretrain(dataclasses.replace(good, max_hours=1e-9))  # stops, saved, after step 1
    with pytest.raises(TrainingDiverged, match=r"last good checkpoint \(step 1\) is untouched and the run resumes"):
        pretrain(dataclasses.replace(good, lr=1e12, grad_clip=0.0, allow_change="lr,grad_clip"))
    slot = current_slot(run)
    assert json.loads((slot / "train_state.json").read_text())["step"] == 1
    assert all(torch.isfinite(t).all() for t in load_file(str(slot / "model.safetensors")).values())
    assert pretrain(good)["steps"] == 20  # the original options continue from the last good state


# ------------------------------------------------------------------------------------------- compile and precision
def test_compile_auto_by_hand():
    cpu, cuda = DeviceFacts("cpu"), DeviceFacts("cuda", "NVIDIA A100", (8, 0))

    def never():
        raise AssertionError("measured although the answer was known")

    assert choose_compile("on", cpu, 10, never)[0] and not choose_compile("off", cuda, 1e6, never)[0]
    assert choose_compile("auto", cuda, 10, never)[0]
    assert not choose_compile("auto", DeviceFacts("mps", macos=(14, 0)), 1e6, never)[0]
    assert not choose_compile("auto", cpu, 600, never)[0]  # 10 minutes: not worth measuring
    gain = {"eager_step_s": 1.0, "compiled_step_s": 0.8, "compile_s": 400.0}
    # 1.25x per step saves 20% of the run: 2 hours -> 1,440 s saved > 400 s of compiling
    on, why = choose_compile("auto", cpu, 7200, lambda: gain)
    assert on and "1.25x" in why and "saves ~17 min" in why
    # 30 minutes -> 360 s saved < 400 s: stays eager, and says why
    on, why = choose_compile("auto", cpu, 1800, lambda: gain)
    assert not on and "would cost ~1 min" in why


def test_precisions_a_device_cannot_run_are_refused_with_the_alternative(monkeypatch):
    with pytest.raises(UsageError, match="fp16 needs a GPU"):
        check_precision("cpu", "fp16")
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: False)
    with pytest.raises(UsageError, match="macOS 14"):
        check_precision("mps", "bf16")
    monkeypatch.setattr("hitoban.training.hardware.cpu_has_native_bf16", lambda: False)
    said = []
    check_precision("cpu", "bf16", warn=said.append)
    assert "emulated" in said[0]
    check_precision("cpu", "no", warn=said.append)
    assert len(said) == 1


@pytest.mark.slow
def test_a_compiled_run_resumes_bit_exactly_and_an_eager_run_resumes_it(tiny_shards, tmp_path):
    """Compiled on a CPU, the run uses deterministic algorithms (Inductor's kernels otherwise reduce in a varying
    order: two uninterrupted compiled runs differed by ~6e-5), so a compiled night resumes bit for bit."""
    def weights(run):
        return load_file(str(current_slot(run) / "model.safetensors"))

    options = dict(steps=8, log_every=4, eval_every=1000, compile="on")
    pretrain(config(tiny_shards, tmp_path / "whole", **options))
    pretrain(config(tiny_shards, tmp_path / "whole2", **options))
    cut = config(tiny_shards, tmp_path / "cut", **options, max_hours=1e-9)
    pretrain(cut)  # stops (and saves) after one step
    pretrain(dataclasses.replace(cut, max_hours=None))
    a, b, c = weights(tmp_path / "whole"), weights(tmp_path / "cut"), weights(tmp_path / "whole2")
    assert a.keys() == b.keys() and not any("_orig_mod" in k for k in a)  # plain names in a compiled checkpoint
    assert all(torch.equal(a[k], c[k]) for k in a)  # no noise between two compiled runs
    assert all(torch.equal(a[k], b[k]) for k in a)  # and the interrupted one equals them
    assert not torch.are_deterministic_algorithms_enabled()  # the process is left as it was found
    eager = config(tiny_shards, tmp_path / "cut", steps=12, log_every=4, eval_every=1000, compile="off")
    summary = pretrain(dataclasses.replace(eager, allow_change="total_steps"))  # eager continues the compiled run
    assert summary["steps"] == 12 and not summary["compiled"]
