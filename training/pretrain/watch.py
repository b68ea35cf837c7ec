"""`hitoban watch RUN`: a progress view of a running (or finished) run from its heartbeat.json: pretraining's or a
federated run's, one view for both (the run folder's files are read through hitoban.run_folder)."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from hitoban.errors import InputError
from hitoban.options import checked_against
from hitoban.run_folder import FEDERATED_HEARTBEAT, RunFolder
from hitoban.training.pretrain.options import WatchOptions

STALE_SECONDS = 180


def progress_bar(done: float) -> str:
    return "█" * round(done * 32) + "░" * (32 - round(done * 32))


def eta_line(hb: dict, now: float) -> list[str]:
    """The ETA and its clock time, while the run is not finished."""
    if hb.get("eta_hours") is None or hb.get("finished"):
        return []
    finish = datetime.fromtimestamp(now + hb["eta_hours"] * 3600).strftime("%H:%M")
    return [f"ETA {hb['eta_hours']:.2f} h (about {finish})"]


def read_heartbeat(path: Path) -> dict:
    """A heartbeat, pretraining's or a federated run's, with every field the view prints of its type (read through
    hitoban.run_folder, which knows both kinds)."""
    return RunFolder(path.parent).heartbeat_now()


def progress(hb: dict) -> dict:
    """What the view shows, whichever kind of run wrote the heartbeat: the done fraction and its place, tokens, the
    losses and the rest of its lines, per machine (a federated run's), and the status."""
    best = f"{hb['best_val']:.4f}" if hb.get("best_val") is not None else "not measured yet"
    resumes = f"elapsed {hb['elapsed_hours']:.2f} h   resumes {hb['resumes']}"
    if hb.get("kind") == FEDERATED_HEARTBEAT:  # training/federated/server.py: rounds over the token budget
        return {"done": hb["tokens_seen"] / max(hb["token_budget"], 1), "place": f"round {hb['round']:,}",
                "lines": [f"val loss {best}   sent {hb['bytes_sent'] / 2**20:,.1f} MiB   re-issued ranges "
                          f"{hb['reissued']}   {resumes}"],
                "machines": [f"  {name:<16} {m.get('tok_s', 0) / 1000:7.1f}k tok/s  {m.get('windows', 0):>9,} "
                             f"windows  {m.get('tasks', 0):>4} tasks  {m.get('lost_tasks', 0):>3} lost"
                             for name, m in sorted(hb["machines"].items())],
                "finished": "finished",
                "stale": "a round may be waiting for a machine's lease, or the server stopped (the same command "
                         "resumes)"}
    loss = f"{hb['train_loss']:.4f}" if hb.get("train_loss") is not None else "-"
    return {"done": hb["step"] / max(hb["total_steps"], 1), "place": f"step {hb['step']:,}/{hb['total_steps']:,}",
            "lines": [f"train loss {loss}   best val {best}   lr {hb['lr']:.3e}",
                      f"{hb['tok_per_sec'] / 1000:.1f}k tok/s" + (f" (MFU {hb['mfu']:.0%})" if hb.get("mfu") else "")
                      + f"   {resumes}"],
            "machines": [], "finished": f"finished: {hb.get('stop_reason')}",
            "stale": "the run may have crashed (resume with --resume auto)"}


def render(run: str | Path, now: float | None = None) -> str:
    """One screen of text for either kind of run: bar, place, tokens, losses, speed, elapsed, resumes, machines,
    ETA, memory, status."""
    path = Path(run) / "heartbeat.json"
    if not path.exists() and not path.is_symlink():
        return f"waiting for {path} (the run writes it after its first log interval)"
    hb = read_heartbeat(path)
    now = now or time.time()
    view = progress(hb)
    lines = [f"[{progress_bar(view['done'])}] {view['done']:6.1%}  {view['place']}",
             f"tokens {hb['tokens_seen']:,} / {hb['token_budget']:,}", *view["lines"], *view["machines"]]
    lines += eta_line(hb, now)
    if hb.get("peak_gb"):
        lines.append(f"peak memory {hb['peak_gb']:.1f} GB")
    age = now - hb["updated_at"]
    lines.append(view["finished"] if hb.get("finished") else f"no update for {age / 60:.0f} min — {view['stale']}"
                 if age > STALE_SECONDS else f"updated {age:.0f} s ago")
    return "\n".join(lines)


@checked_against(WatchOptions, "interval")
def watch(run: str | Path, interval: float = 10.0, once: bool = False) -> None:
    while True:
        try:
            text = render(run)
        except InputError as err:  # a damaged heartbeat: refused with --once; a live view says so and tries again
            if once:
                raise
            text = f"{err}; trying again"
        print(text if once else "\033[2J\033[H" + text, flush=True)
        if once or "finished" in text.splitlines()[-1]:
            return
        time.sleep(interval)
