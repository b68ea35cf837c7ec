"""`--supervise` (training/pretrain/supervise.py): no crash loop, and Ctrl-C lets the run save, then stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hitoban.training.pretrain.checkpoint import current_slot
from hitoban.training.pretrain.supervise import keep_awake_prefix, supervise

CHILD = textwrap.dedent("""
    import pathlib, signal, sys, time
    out = pathlib.Path(sys.argv[1])
    def stop(signum, frame):
        time.sleep(1.0)  # the save at the next step boundary
        (out / "saved").write_text("yes")
        sys.exit(0)
    signal.signal(signal.SIGINT, stop)
    (out / "ready").write_text("yes")
    while True:
        time.sleep(0.05)
""")


@pytest.mark.slow  # ~10-13 s: keeps the fast tier under 3 minutes
def test_supervise_stops_on_a_crash_loop_and_returns_success(tiny_shards, tmp_path):
    assert keep_awake_prefix() in ([], ["systemd-inhibit", "--what=sleep:idle", "--who=hitoban",
                                        "--why=overnight pretraining"])
    crash = ["pretrain", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "r"), "--steps", "5"]
    assert supervise(crash, tmp_path / "r", max_restarts=5, pause=0) == 2  # no progress: one attempt, no loop
    ok = ["pretrain", "--data", str(tiny_shards), "--out", str(tmp_path / "ok"), "--preset", "tiny", "--context",
          "64", "--steps", "6", "--batch-size", "4", "--no-progress", "--cpu"]
    assert supervise(ok, tmp_path / "ok", max_restarts=2, pause=0) == 0
    assert json.loads((current_slot(tmp_path / "ok") / "train_state.json").read_text())["step"] == 6


@pytest.mark.slow
def test_ctrl_c_under_supervise_lets_the_run_save_and_does_not_relaunch(tmp_path):
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    driver = (f"import sys; from pathlib import Path; from hitoban.training.pretrain.supervise import supervise; "
              f"sys.exit(supervise([{str(tmp_path)!r}], Path({str(tmp_path / 'run')!r}), pause=0, "
              f"command=[sys.executable, {str(child)!r}]))")
    proc = subprocess.Popen([sys.executable, "-c", driver], start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 60
    while not (tmp_path / "ready").exists() and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
    output, _ = proc.communicate(timeout=60)
    assert (tmp_path / "saved").exists(), output  # subprocess.call SIGKILLed the child 0.25 s in
    assert proc.returncode == 0 and "waiting for the run to save" in output
    assert output.count("attempt") == 1  # stopped by the user: not relaunched
