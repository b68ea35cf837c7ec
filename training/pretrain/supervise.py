"""`hitoban pretrain --supervise`: relaunch after a crash, but only while the saved step advances (docs/design.md §6).

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

from hitoban.errors import ExitCode
from hitoban.options import argv_for, flag_of
from hitoban.training.pretrain.checkpoint import TrainState, current_slot
from hitoban.training.pretrain.options import PretrainConfig, SuperviseOptions

_DEFAULTS = SuperviseOptions()


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


def wait_through_ctrl_c(proc: subprocess.Popen) -> tuple[int, bool]:
    """(exit code, interrupted?). Ctrl-C reaches the whole process group: the run saves at its next step and exits,
    so the supervisor waits for it (`subprocess.call` would SIGKILL it 0.25 s later, before the promised save). A
    second Ctrl-C reaches the run too, which then quits at once."""
    interrupted = False
    while True:
        try:
            return proc.wait(), interrupted
        except KeyboardInterrupt:
            if not interrupted:
                print("\nsupervise: waiting for the run to save and stop (Ctrl-C again to quit now)", flush=True)
            interrupted = True


def supervise(argv: list[str], run: Path, max_restarts: int = _DEFAULTS.max_restarts, pause: float = 10.0,
              command: list[str] | None = None) -> int:
    """Run `hitoban <argv>` (or `command` + argv; `--supervise` itself is dropped) until it exits 0; returns the
    final exit code. After a Ctrl-C it does not relaunch."""
    argv = [a for a in argv if a != flag_of(SuperviseOptions, "supervise")]
    if flag_of(PretrainConfig, "resume") not in argv:
        argv += argv_for(PretrainConfig, resume="auto")
    prefix = keep_awake_prefix()
    previous = saved_step(run)
    for attempt in range(1, max_restarts + 2):
        print(f"supervise: attempt {attempt} from step {max(previous, 0)}"
              + (f" ({' '.join(prefix[:1])} keeps the machine awake)" if prefix else ""), flush=True)
        code, interrupted = wait_through_ctrl_c(
            subprocess.Popen(prefix + (command or [sys.executable, "-m", "hitoban.cli"]) + argv))
        if code == 0 or interrupted:
            if interrupted:
                print(f"supervise: stopped by Ctrl-C; the run saved step {max(saved_step(run), 0)} (resume with the "
                      "same command)", flush=True)
            return code
        if code == ExitCode.DIVERGED:
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
    return code
