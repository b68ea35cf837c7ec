"""Crash-safe A/B checkpoints (training/pretrain/checkpoint.py): a failed or full save keeps the previous slot, a
damaged newest slot falls back to the one before, --resume never keeps the earlier run until it has saved, and one
process trains in a run folder at a time."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch
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


def zero_block(path, size: int = 4096) -> None:
    """Zero `size` bytes inside `path` where some are not zero yet (the middle first); the file keeps its size."""
    data = bytearray(path.read_bytes())
    starts = [s for s in range(len(data) // 2, len(data), size)] + list(range(0, len(data) // 2, size))
    start = next(s for s in starts if any(data[s:s + size]))
    data[start:start + size] = bytes(len(data[start:start + size]))
    path.write_bytes(bytes(data))


def test_a_damaged_newest_slot_falls_back_to_the_previous_one_and_says_so(tiny_shards, tmp_path, capsys):
    """Issue 35: 4 KiB zeroed inside model.safetensors (same size) was resumed without a word. Now the slot's
    checksums catch it: the previous slot is resumed, one line names the file, and the next save overwrites the
    damaged slot, not the intact one. With both slots damaged, `hitoban pretrain` refuses in one line, exit 2."""
    from hitoban.cli import main
    from hitoban.options import to_argv
    from hitoban.training.pretrain.checkpoint import verify_slot

    run = tmp_path / "run"
    cfg = night_config(tiny_shards, run, steps=20, save_every_steps=5, eval_every=1000)
    pretrain(cfg)
    newest = current_slot(run)
    zero_block(newest / "model.safetensors")
    capsys.readouterr()
    summary = pretrain(dataclasses.replace(cfg, steps=25, allow_change="total_steps"))
    out = capsys.readouterr().out
    assert summary["steps"] == 25 and f"{newest.name} is damaged (model.safetensors: its sha256 differs" in out
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["type"] == "resume"] == [15]  # the slot before the damaged one
    assert verify_slot(run / "ckpt-A") and verify_slot(run / "ckpt-B")  # the damaged slot was the one rewritten
    for slot in ("ckpt-A", "ckpt-B"):
        zero_block(run / slot / "model.safetensors")
    capsys.readouterr()
    code = main(["pretrain", *to_argv(dataclasses.replace(cfg, steps=30, allow_change="total_steps"), skip=())])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "ckpt-A is damaged (model.safetensors" in err and "ckpt-B is damaged (model.safetensors" in err
    assert "no other complete checkpoint" in err and "--resume never" in err


@pytest.mark.slow
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


def _tiny_model():
    from hitoban.modeling import HitobanConfig, HitobanForCausalLM

    torch.manual_seed(0)
    return HitobanForCausalLM(HitobanConfig.from_preset("tiny", vocab_size=64))


def _loss(model) -> torch.Tensor:
    """A loss every parameter has a gradient of."""
    return sum(p.sum() for p in model.parameters())


def test_the_fp16_gradient_scalers_state_is_saved_and_restored(tmp_path):
    """Issue 34: the GradScaler's state was not in the checkpoint, so every resume restarted the scale at 65,536 (and
    its growth count at 0). After a few skipped overflow steps the scale is 2^13 and the count 3: a fresh scaler
    loaded from the slot must have exactly those; one loaded without it (the control) does not."""
    from hitoban.training.optim import AdamW
    from hitoban.training.pretrain.checkpoint import TrainState, load_checkpoint, save_checkpoint

    model, scaler = _tiny_model(), torch.amp.GradScaler("cpu", init_scale=2.0**16)
    optimizer = AdamW(model.parameters())
    for _ in range(3):  # three overflows: the scaler skips each update and halves its scale
        scaler.scale(_loss(model) * float("inf")).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    for _ in range(3):
        scaler.scale(_loss(model)).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    assert (scaler.get_scale(), scaler.state_dict()["_growth_tracker"]) == (2.0**13, 3)
    slot = save_checkpoint(tmp_path / "run", model, optimizer, TrainState(run_id="r", seed=0, step=6), None, scaler)
    fresh = torch.amp.GradScaler("cpu")
    load_checkpoint(slot, _tiny_model(), AdamW(_tiny_model().parameters()), fresh)
    assert fresh.state_dict() == scaler.state_dict()
    assert torch.amp.GradScaler("cpu").state_dict() != scaler.state_dict()  # the control: what a resume had before


def test_an_fp16_slot_without_scaler_state_is_refused_not_silently_reset(tmp_path):
    from hitoban.training.optim import AdamW
    from hitoban.training.pretrain.checkpoint import TrainState, load_checkpoint, save_checkpoint

    model = _tiny_model()
    optimizer = AdamW(model.parameters())
    _loss(model).backward()
    optimizer.step()
    slot = save_checkpoint(tmp_path / "run", model, optimizer, TrainState(run_id="r", seed=0, step=1), None)
    with pytest.raises(CheckpointError, match="no gradient scaler state"):
        load_checkpoint(slot, _tiny_model(), AdamW(_tiny_model().parameters()), torch.amp.GradScaler("cpu"))


def test_an_optimizer_that_keeps_no_state_resumes(tmp_path):
    """Issue 34: `federate serve --outer-momentum 0` could not resume: torch's SGD without momentum keeps no
    per-parameter state and the loader refused the checkpoint ('no moments'). An empty state is restored as empty;
    one that had state and lost a parameter's is still refused (the control)."""
    from safetensors.torch import load_file, save_file

    from hitoban.training.pretrain.checkpoint import TrainState, load_checkpoint, save_checkpoint

    model = _tiny_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.0)
    _loss(model).backward()
    sgd.step()
    slot = save_checkpoint(tmp_path / "run", model, sgd, TrainState(run_id="r", seed=0, step=1), None)
    again = _tiny_model()
    fresh = torch.optim.SGD(again.parameters(), lr=0.1, momentum=0.0)
    assert load_checkpoint(slot, again, fresh)[1] and not fresh.state and fresh.param_groups[0]["lr"] == 0.5
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), model.parameters()))

    moving = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    _loss(model).backward()
    moving.step()
    slot = save_checkpoint(tmp_path / "run", model, moving, TrainState(run_id="r", seed=0, step=2), None)
    tensors = load_file(str(slot / "optimizer.safetensors"))
    save_file({k: v for k, v in tensors.items() if not k.startswith("model.embed_tokens")},
              str(slot / "optimizer.safetensors"))
    with pytest.raises(CheckpointError, match="no moments for model.embed_tokens.weight"):
        load_checkpoint(slot, _tiny_model(), torch.optim.SGD(_tiny_model().parameters(), lr=0.5, momentum=0.9))


# ------------------------------------------------------------------ checksums: every file of a slot, every damage
MUTATIONS = {
    "zero a 4 KiB block": zero_block,
    "truncate": lambda path: path.write_bytes(path.read_bytes()[: path.stat().st_size // 2]),
    "flip a byte": lambda path: path.write_bytes(_flipped(path.read_bytes())),
    "delete": lambda path: path.unlink(),
    "append garbage": lambda path: path.write_bytes(path.read_bytes() + b"garbage"),
}


def _flipped(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]


@pytest.fixture(scope="module")
def two_slots(tiny_shards, tmp_path_factory):
    """A real tiny run's CURRENT and both slots (steps 5 and 10), with its tokenizer: what every case copies."""
    run = tmp_path_factory.mktemp("slots") / "run"
    pretrain(night_config(tiny_shards, run, steps=10, save_every_steps=5, eval_every=1000))
    return run


def _copy_run(source, target):
    target.mkdir(parents=True)
    for name in ("CURRENT", "ckpt-A", "ckpt-B"):
        (shutil.copytree if (source / name).is_dir() else shutil.copy2)(source / name, target / name)
    return target


def _resume(run, intact):
    """load_latest into fresh objects (shaped by the `intact` run's config): (the slot resumed, or the error's
    message; the lines it printed)."""
    from hitoban.modeling import HitobanConfig, HitobanForCausalLM
    from hitoban.training.optim import AdamW
    from hitoban.training.pretrain.checkpoint import load_latest

    model = HitobanForCausalLM(HitobanConfig.from_pretrained(intact / "ckpt-A"))
    lines: list[str] = []
    try:
        slot, *_ = load_latest(run, model, AdamW(model.parameters()), log=lines.append)
    except CheckpointError as err:
        return f"{type(err).__name__}: {err}", lines
    return slot.name, lines


def damage_cases(run):
    """(file, mutation) for every file of the newest slot, its marker included, and each mutation."""
    newest = current_slot(run)
    return [(file.name, mutation) for file in sorted(newest.iterdir()) for mutation in MUTATIONS]


@pytest.mark.slow
def test_every_damaged_file_makes_the_resume_fall_back_naming_it_and_both_damaged_refuse(two_slots, tmp_path):
    newest, older = current_slot(two_slots).name, ({"ckpt-A", "ckpt-B"} - {current_slot(two_slots).name}).pop()
    assert _resume(two_slots, two_slots) == (newest, [])  # intact: the newest, without a word
    cases, failures = damage_cases(two_slots), {}
    assert len(cases) >= 6 * len(MUTATIONS)  # weights, optimizer, config, tokenizer, train state, COMPLETE
    for i, (name, mutation) in enumerate(cases):
        run = _copy_run(two_slots, tmp_path / f"one-{i}")
        MUTATIONS[mutation](run / newest / name)
        got, lines = _resume(run, two_slots)
        named = [line for line in lines if f"{newest} is damaged ({name}:" in line and f"resuming from {older}" in line]
        if got != older or len(lines) != 1 or not named:
            failures[(name, mutation)] = (got, lines)
        MUTATIONS[mutation](run / older / name)
        got, lines = _resume(run, two_slots)
        if not (got.startswith("CheckpointDamaged") and f"{older} is damaged ({name}:" in got
                and "--resume never" in got):
            failures[(name, mutation, "both")] = (got, lines)
    assert failures == {}


def test_without_verification_a_zeroed_block_resumes_silently(two_slots, tmp_path, monkeypatch):
    """Negative control: with the verifier accepting everything, the zeroed block is loaded from the newest slot
    without a word, as before issue 35; the test above would catch that."""
    monkeypatch.setattr(checkpoint_module, "verify_slot", lambda slot: True)
    run = _copy_run(two_slots, tmp_path / "run")
    newest = current_slot(run).name
    zero_block(run / newest / "model.safetensors")
    assert _resume(run, two_slots) == (newest, [])


def test_an_older_slot_without_checksums_is_loaded_unverified_and_says_so(two_slots, tmp_path):
    run = _copy_run(two_slots, tmp_path / "run")
    newest = current_slot(run)
    (newest / "COMPLETE").write_text("1700000000\nstep=10\n")  # the marker hitoban wrote before issue 35
    got, lines = _resume(run, two_slots)
    assert got == newest.name and lines == [f"note: {newest.name} was written by an older hitoban without "
                                            "checksums; it is loaded unverified"]


def test_optimizer_state_dropped_on_purpose_is_resealed_not_damage(two_slots, tmp_path):
    """The kill test's control resumes without optimizer state: `drop_optimizer_state` removes it and re-seals the
    slot, where deleting the file by hand is damage (above)."""
    from hitoban.training.pretrain.checkpoint import drop_optimizer_state, verify_slot

    run = _copy_run(two_slots, tmp_path / "run")
    newest = current_slot(run)
    drop_optimizer_state(newest)
    assert verify_slot(newest) and not (newest / "optimizer.safetensors").exists()
    assert _resume(run, two_slots) == (newest.name, [])


# ------------------------------------------------------------------ a change to what a checkpoint records stays here


def test_a_new_train_state_field_needs_only_its_declaration(tmp_path):
    """Issue 36: what a checkpoint records is TrainState's fields, written and read generically. A field added with a
    default (here by subclassing, as an edit to the class would) round-trips through the real save path with no
    other change; a slot written before it reads with the default; and the code before it refuses the newer slot by
    the field's name instead of dropping it (the control: a generic reader that silently ignored fields would pass
    the first two)."""
    from hitoban.training.optim import AdamW
    from hitoban.training.pretrain.checkpoint import TrainState, save_checkpoint

    with_note = dataclasses.make_dataclass("TrainState", [("note", str, dataclasses.field(default=""))],
                                           bases=(TrainState,))
    model = _tiny_model()
    newer = save_checkpoint(tmp_path / "new", model, AdamW(model.parameters()),
                            with_note(run_id="r", seed=0, step=3, note="kept"), None)
    assert with_note.read(newer).note == "kept" and with_note.read(newer).step == 3
    older = save_checkpoint(tmp_path / "old", model, AdamW(model.parameters()), TrainState(run_id="r", seed=0), None)
    assert with_note.read(older).note == ""
    with pytest.raises(CheckpointError, match=r"newer hitoban.*'note'"):
        TrainState.read(newer)
