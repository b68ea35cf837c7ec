"""The kill test (training/pretrain/killtest.py): killed-and-resumed equals uninterrupted, the restore check
can fail, and on a GPU its runs go one at a time (docs/design.md §8)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import night_config
from safetensors.torch import load_file

from hitoban.training.pretrain.checkpoint import current_slot
from hitoban.training.pretrain.killtest import run_killtest
from hitoban.training.pretrain.trainer import pretrain

KILLTEST_OPTIONS = ["--preset", "tiny", "--context", "64", "--batch-size", "8", "--seed", "4242", "--cpu"]


def launches(monkeypatch) -> list[tuple[str, list[str]]]:
    """Every training the harness starts: (its run folder's name, the trainings still running as it starts)."""
    from hitoban.training.pretrain import killtest

    started, running, launch = [], [], killtest.subprocess.Popen

    def popen(args, **kwargs):
        proc = launch(args, **kwargs)
        if "--out" in args:
            started.append((Path(args[args.index("--out") + 1]).name,
                            [name for name, other in running if other.poll() is None]))
            running.append((started[-1][0], proc))
        return proc

    monkeypatch.setattr(killtest.subprocess, "Popen", popen)
    return started


@pytest.mark.slow(seconds=40)
def test_killtest_resumed_run_is_bit_identical_and_the_control_fails(tiny_shards, tmp_path, monkeypatch):
    """With the night's own options, here dropout 0.1 (finding 5: the kill test used to ignore them, and a dropout
    run did not resume exactly, finding 4)."""
    options = KILLTEST_OPTIONS + ["--dropout", "0.1"]
    started = launches(monkeypatch)
    result = run_killtest(tiny_shards, tmp_path / "kt", options, steps=30, log=lambda *_: None)
    # on the CPU each uninterrupted run trains beside a killed attempt, the control beside the last resume
    assert started == [("base1", []), ("killed", ["base1"]), ("base2", []), ("killed", ["base2"]), ("killed", []),
                       ("noopt", ["killed"])]
    assert result["passed"], result["checks"]
    assert result["fingerprint"]["dropout"] == 0.1 and result["options"] == options
    assert result["noise"] == 0.0 and result["killed_bit_identical"] and result["killed_diff"] == 0.0
    assert result["resumes"] >= 2 and result["loss_step"] == 0.0 and result["loss_compared_steps"]
    assert result["control_diff"] > 0.0  # negative control: a dropped optimizer state is visible
    assert result["restore"]["exact"] and result["restore"]["tensors"] > 20
    from hitoban.evaluation.plots import plot_killtest

    plot_killtest(result, tmp_path / "kt" / "killtest.png")
    assert (tmp_path / "kt" / "killtest.png").stat().st_size > 10_000


@pytest.mark.slow(seconds=50)
def test_killtest_with_muon_and_wsd_in_the_gpus_one_at_a_time_order(tiny_shards, tmp_path, monkeypatch):
    """Run here in the order a GPU gets (its trainings one at a time, none beside a killed attempt), so that path
    runs somewhere without a GPU; the other kill tests take the CPU's (uninterrupted runs beside the killed ones)."""
    from hitoban.training.pretrain import killtest

    monkeypatch.setattr(killtest, "runs_in_parallel", lambda *_: False)
    started = launches(monkeypatch)
    options = KILLTEST_OPTIONS + ["--optimizer", "muon", "--schedule", "wsd"]
    result = run_killtest(tiny_shards, tmp_path / "kt", options, steps=30, log=lambda *_: None)
    assert result["passed"], result["checks"]
    assert result["killed_bit_identical"] and result["fingerprint"]["optimizer"] == "muon"
    assert started == [("base1", []), ("base2", []), ("killed", []), ("killed", []), ("killed", []), ("noopt", [])]


def test_restore_check_compares_memory_with_a_fresh_reload_and_can_fail(tiny_shards, tmp_path):
    """Check [A] used to reload a checkpoint and compare it with the same file. Now the digest is taken from the
    live objects before the save; a checkpoint that loses anything (here: one optimizer moment) must fail it."""
    from safetensors.torch import save_file

    from hitoban.training import faults
    from hitoban.training.pretrain.killtest import restore_check

    with faults.scoped(state_digest_dir=tmp_path):
        pretrain(night_config(tiny_shards, tmp_path / "run", steps=4, eval_every=100))
    slot = current_slot(tmp_path / "run")
    digest = tmp_path / "step-4.json"
    assert restore_check(slot, digest)["exact"]
    moments = load_file(str(slot / "optimizer.safetensors"))
    name = next(k for k in moments if k.endswith(".v"))
    moments[name] = moments[name] * 1.0001
    save_file(moments, str(slot / "optimizer.safetensors"))
    broken = restore_check(slot, digest)
    assert not broken["exact"] and broken["mismatches"] == [f"optimizer.{name}"]


def test_the_kill_test_runs_its_trainings_one_at_a_time_on_a_gpu():
    from hitoban.training.pretrain.killtest import runs_in_parallel

    assert runs_in_parallel([], "cpu") and not runs_in_parallel([], "cuda") and not runs_in_parallel([], "mps")
    assert runs_in_parallel(["--cpu"])  # the CPU on any machine
