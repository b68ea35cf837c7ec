"""`hitoban pretrain --supervise`: relaunch after a crash, but only while the saved step advances (3LM §4.8).

Each attempt runs the same `hitoban pretrain` command with `--resume auto`. Exit 0 ends supervision; a crash
relaunches after a short pause unless the last attempt saved no new step (a crash loop), or after `max_restarts`.
Where the OS offers it, the machine is kept awake: macOS `caffeinate -dimsu`, Linux `systemd-inhibit`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from hitoban.training.checkpoint import TrainState, current_slot


def saved_step(run: Path) -> int:
    slot = current_slot(run)
    return TrainState.read(slot).step if slot else -1


def keep_awake_prefix() -> list[str]:
    if sys.platform == "darwin" and shutil.which("caffeinate"):
        return ["caffeinate", "-dimsu"]
    if sys.platform.startswith("linux") and shutil.which("systemd-inhibit"):
        prefix = ["systemd-inhibit", "--what=sleep:idle", "--who=hitoban", "--why=overnight pretraining"]
        # Installed is not enough: without a system D-Bus (containers, some servers) it fails every command.
        if subprocess.run(prefix + ["true"], capture_output=True).returncode == 0:
            return prefix
    return []


def supervise(argv: list[str], run: Path, max_restarts: int = 40, pause: float = 10.0) -> int:
    """Run `hitoban <argv>` until it exits 0; returns the final exit code."""
    argv = [a for a in argv if a != "--supervise"]
    if "--resume" not in argv:
        argv += ["--resume", "auto"]
    prefix = keep_awake_prefix()
    previous = saved_step(run)
    for attempt in range(1, max_restarts + 2):
        print(f"supervise: attempt {attempt} from step {max(previous, 0)}"
              + (f" ({' '.join(prefix[:1])} keeps the machine awake)" if prefix else ""), flush=True)
        code = subprocess.call(prefix + [sys.executable, "-m", "hitoban.cli", *argv])
        if code == 0:
            return 0
        if code == 3:
            print("supervise: the loss diverged (NaN); not restarting", flush=True)
            return code
        step = saved_step(run)
        if step <= previous:
            print(f"supervise: attempt {attempt} exited {code} without saving a new step (still {step}); "
                  "stopping to avoid a crash loop", flush=True)
            return code
        previous = step
        if attempt > max_restarts:
            break
        print(f"supervise: exited {code} at saved step {step}; relaunching in {pause:.0f} s", flush=True)
        time.sleep(pause)
    print(f"supervise: gave up after {max_restarts} restarts", flush=True)
    return 1
