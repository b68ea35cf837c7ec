"""`hitoban watch RUN`: a progress view of a running (or finished) pretraining from its heartbeat.json."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from hitoban.errors import InputError
from hitoban.files import check_fields, read_json

STALE_SECONDS = 180


def progress_bar(done: float) -> str:
    return "█" * round(done * 32) + "░" * (32 - round(done * 32))


def eta_line(hb: dict, now: float) -> list[str]:
    """The ETA and its clock time, while the run is not finished."""
    if hb.get("eta_hours") is None or hb.get("finished"):
        return []
    finish = datetime.fromtimestamp(now + hb["eta_hours"] * 3600).strftime("%H:%M")
    return [f"ETA {hb['eta_hours']:.2f} h (about {finish})"]


NUMBER = (int, float)
HEARTBEAT_FIELDS = {"step": int, "total_steps": int, "tokens_seen": int, "token_budget": int, "lr": NUMBER,
                    "tok_per_sec": NUMBER, "elapsed_hours": NUMBER, "resumes": int, "updated_at": NUMBER}
FEDERATED_FIELDS = {"round": int, "tokens_seen": int, "token_budget": int, "bytes_sent": NUMBER, "reissued": int,
                    "elapsed_hours": NUMBER, "resumes": int, "machines": dict, "updated_at": NUMBER}
OPTIONAL_NUMBERS = ("best_val", "train_loss", "eta_hours", "mfu", "peak_gb")


def read_heartbeat(path: Path) -> dict:
    """A heartbeat, pretraining's or a federated run's, with every field the view prints of its type."""
    hb = read_json(path, f"{path.parent}", fields={})
    kind = FEDERATED_FIELDS if hb.get("kind") == "federated-heartbeat" else HEARTBEAT_FIELDS
    check_fields(hb, kind, f"{path.parent}: heartbeat.json")
    for name in OPTIONAL_NUMBERS:
        if hb.get(name) is not None:
            check_fields(hb, {name: NUMBER}, f"{path.parent}: heartbeat.json")
    return hb


def render(run: str | Path, now: float | None = None) -> str:
    """One screen of text: bar, step, tokens, loss, best val, tok/s, elapsed, ETA, resumes, status."""
    path = Path(run) / "heartbeat.json"
    if not path.exists() and not path.is_symlink():
        return f"waiting for {path} (the run writes it after its first log interval)"
    hb = read_heartbeat(path)
    now = now or time.time()
    if hb.get("kind") == "federated-heartbeat":
        return render_federated(hb, now)
    done = hb["step"] / max(hb["total_steps"], 1)
    bar = progress_bar(done)
    best = f"{hb['best_val']:.4f}" if hb.get("best_val") is not None else "not measured yet"
    loss = f"{hb['train_loss']:.4f}" if hb.get("train_loss") is not None else "-"
    lines = [
        f"[{bar}] {done:6.1%}  step {hb['step']:,}/{hb['total_steps']:,}",
        f"tokens {hb['tokens_seen']:,} / {hb['token_budget']:,}",
        f"train loss {loss}   best val {best}   lr {hb['lr']:.3e}",
        f"{hb['tok_per_sec'] / 1000:.1f}k tok/s" + (f" (MFU {hb['mfu']:.0%})" if hb.get("mfu") else "")
        + f"   elapsed {hb['elapsed_hours']:.2f} h   resumes {hb['resumes']}",
    ]
    lines += eta_line(hb, now)
    if hb.get("peak_gb"):
        lines.append(f"peak memory {hb['peak_gb']:.1f} GB")
    age = now - hb["updated_at"]
    if hb.get("finished"):
        lines.append(f"finished: {hb.get('stop_reason')}")
    elif age > STALE_SECONDS:
        lines.append(f"no update for {age / 60:.0f} min — the run may have crashed (resume with --resume auto)")
    else:
        lines.append(f"updated {age:.0f} s ago")
    return "\n".join(lines)


def render_federated(hb: dict, now: float) -> str:
    """A federated run (training/federated/server.py): rounds, machines, tokens, bytes sent, ETA."""
    done = hb["tokens_seen"] / max(hb["token_budget"], 1)
    bar = progress_bar(done)
    best = f"{hb['best_val']:.4f}" if hb.get("best_val") is not None else "not measured yet"
    lines = [f"[{bar}] {done:6.1%}  round {hb['round']:,}  tokens {hb['tokens_seen']:,} / {hb['token_budget']:,}",
             f"val loss {best}   sent {hb['bytes_sent'] / 2**20:,.1f} MiB   re-issued ranges {hb['reissued']}   "
             f"elapsed {hb['elapsed_hours']:.2f} h   resumes {hb['resumes']}"]
    for name, m in sorted(hb["machines"].items()):
        lines.append(f"  {name:<16} {m.get('tok_s', 0) / 1000:7.1f}k tok/s  {m.get('windows', 0):>9,} windows  "
                     f"{m.get('tasks', 0):>4} tasks  {m.get('lost_tasks', 0):>3} lost")
    lines += eta_line(hb, now)
    age = now - hb["updated_at"]
    lines.append("finished" if hb.get("finished") else
                 f"no update for {age / 60:.0f} min: a round may be waiting for a machine's lease, or the server "
                 "stopped (the same command resumes)" if age > STALE_SECONDS else f"updated {age:.0f} s ago")
    return "\n".join(lines)


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
