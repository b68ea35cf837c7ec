"""The night's monitor: log.jsonl, heartbeat.json, the progress bar, tok/s and MFU, and the NaN guard.

The training step leaves its loss and gradient norm on the device; the monitor reads them once per log window (and
before every save), which is also where a non-finite loss is caught: the window's updates are discarded and the
last good checkpoint stays the run's state.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from hitoban.errors import ExitCode, HitobanError
from hitoban.run_folder import RunFolder


class TrainingDiverged(HitobanError, RuntimeError):
    """Loss or gradient became NaN/inf; the last good checkpoint is untouched."""

    exit_code = ExitCode.DIVERGED


MAX_SKIPS_IN_A_ROW = 20  # fp16: more overflow skips in a row than this is divergence, not a scale being found


def step_outcome(loss: float, grad_norm: float, fp16: bool, skipped_in_a_row: int,
                 max_skips: int = MAX_SKIPS_IN_A_ROW) -> str:
    """'ok', 'skipped' (fp16: the gradient scaler overflowed and skips this update, as it is meant to) or
    'diverged' (a non-finite loss, a non-finite gradient without fp16, or too many skips in a row)."""
    if not math.isfinite(loss):
        return "diverged"
    if math.isfinite(grad_norm):
        return "ok"
    if fp16 and skipped_in_a_row < max_skips:
        return "skipped"
    return "diverged"


@dataclass
class Monitor:
    """log.jsonl, heartbeat.json, the progress bar, tok/s and MFU; and the NaN guard over the steps it has not yet
    read. Only the main process writes."""

    run: Path
    total_steps: int
    tokens_per_step: int
    token_flops: float  # training FLOPs per token (hardware.flops_per_token)
    peak_flops: float  # of all processes together
    device: torch.device
    fp16: bool
    main: bool = True
    progress: bool = True
    start_step: int = 0
    loss_sum: torch.Tensor | None = None  # this window's losses, summed on the device
    bad: torch.Tensor | None = None  # any non-finite loss (or gradient, outside fp16) since the last read
    window_steps: int = 0
    first_unread_step: int = 0
    last_grad_norm: torch.Tensor | None = None
    last_loss: float | None = None
    tok_per_sec: float = 0.0
    mfus: list[float] = field(default_factory=list)
    skipped_steps: int = 0  # fp16: updates the gradient scaler skipped, over every session (read once per window)
    in_a_row: torch.Tensor | None = None  # fp16: overflow skips in a row up to the last step, on the device
    overflows: list = field(default_factory=list)  # fp16: (step, overflowed?) since the last read, on the device
    window_start: float = field(default_factory=time.time)
    last_heartbeat: float = 0.0
    trackers: object | None = None  # training.trackers.RunTrackers: --report-to gets every record log.jsonl gets

    def __post_init__(self) -> None:
        self.folder = RunFolder(self.run)  # log.jsonl and heartbeat.json are written through it
        self.bar = tqdm(total=self.total_steps, initial=self.start_step, desc="pretrain", unit="step",
                        disable=not (self.main and self.progress) or None)
        self.first_unread_step = self.start_step + 1

    def log(self, record: dict) -> None:
        if self.main:
            self.folder.log(record)
            if self.trackers is not None:
                self.trackers.log(record)

    def mfu(self, tok_per_sec: float) -> float:
        """Model FLOPs utilisation: the FLOPs the model needs per second over what the hardware can do."""
        return tok_per_sec * self.token_flops / self.peak_flops

    def on_step(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Record a finished step without reading the device, under fp16 too: there a non-finite gradient with a
        finite loss is an overflow the gradient scaler skipped (`step_outcome`, computed on the device), counted
        and logged when the window is read; more than MAX_SKIPS_IN_A_ROW in a row is divergence."""
        if self.fp16:
            overflow = torch.isfinite(loss) & ~torch.isfinite(grad_norm)
            self.in_a_row = (overflow.long() if self.in_a_row is None else (self.in_a_row + 1) * overflow)
            self.overflows.append((step, overflow))
            finite = torch.isfinite(loss) & (self.in_a_row <= MAX_SKIPS_IN_A_ROW)
        else:
            finite = torch.isfinite(loss) & torch.isfinite(grad_norm)
        self.bad = ~finite if self.bad is None else self.bad | ~finite
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
        self.last_grad_norm = grad_norm
        self.window_steps += 1
        self.bar.update(1)

    def check_finite(self, step: int, last_saved_step: int, accelerator=None) -> None:
        """Read the NaN guard (one host sync). Raises TrainingDiverged naming the steps since the last read; nothing
        has been saved from them, so the last good checkpoint is the run's state. Over several processes the guard
        is one decision (any rank's non-finite loss is every rank's), so all ranks stop together rather than one
        raising while the others wait in a collective until torchrun kills them."""
        bad = self.bad
        if accelerator is not None and accelerator.num_processes > 1:
            mine = torch.zeros((), device=self.device) if bad is None else bad.float()
            bad = accelerator.reduce(mine, "sum") > 0
        if bad is None or not bool(bad):
            self.first_unread_step = step + 1
            self._read_overflows()
            return
        kept = (f"the last good checkpoint (step {last_saved_step}) is untouched and the run resumes from it"
                if last_saved_step >= 0 else "no checkpoint had been written yet")
        loss = float(self.loss_sum) / max(1, self.window_steps) if self.loss_sum is not None else float("nan")
        raise TrainingDiverged(f"the loss or the gradient became non-finite between steps {self.first_unread_step} "
                               f"and {step} (mean loss {loss}, last grad norm {float(self.last_grad_norm)}); "
                               f"those updates were discarded: {kept}. Lower --lr (resume with --allow-change lr) "
                               "or check the data")

    def _read_overflows(self) -> None:
        """fp16: the window's skipped updates, read in one transfer, logged and counted."""
        if not self.overflows:
            return
        steps = [s for s, _ in self.overflows]
        flags = torch.stack([flag for _, flag in self.overflows]).tolist()
        self.overflows = []
        for step, skipped in zip(steps, flags):
            if skipped:
                self.skipped_steps += 1
                self.log({"type": "skip", "step": step, "reason": "fp16 gradient overflow (the scaler skipped this "
                                                                  "update and lowered its scale)"})

    def log_window(self, step: int, lr: float, elapsed: float, accelerator, last_saved_step: int) -> None:
        """A train record: mean loss over the window (all processes), tok/s and MFU over its wall time."""
        self.check_finite(step, last_saved_step, accelerator)
        loss = accelerator.reduce(self.loss_sum, "mean").item() / self.window_steps
        now = time.time()
        self.tok_per_sec = self.window_steps * self.tokens_per_step / max(now - self.window_start, 1e-9)
        mfu = self.mfu(self.tok_per_sec)
        self.log({"type": "train", "step": step, "loss": loss, "lr": lr, "grad_norm": float(self.last_grad_norm),
                  "tok_per_sec": round(self.tok_per_sec, 1), "mfu": round(mfu, 4), "elapsed": round(elapsed, 2),
                  "window": self.window_steps})
        self.bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{self.tok_per_sec:,.0f}", mfu=f"{mfu:.0%}")
        self.mfus.append(mfu)
        self.last_loss, self.loss_sum, self.window_steps, self.window_start = loss, None, 0, time.time()

    def heartbeat(self, state, lr: float, elapsed: float, finished: bool = False, stop_reason: str | None = None,
                  every: float = 30.0) -> None:
        """heartbeat.json for `hitoban watch` (atomic), at most every `every` seconds unless finished."""
        if not self.main or (not finished and time.time() - self.last_heartbeat < every):
            return
        remaining = (self.total_steps - state.step) * self.tokens_per_step
        tok_s = self.tok_per_sec
        self.folder.heartbeat({
            "updated_at": time.time(), "step": state.step, "total_steps": self.total_steps,
            "tokens_seen": state.tokens_seen, "token_budget": self.total_steps * self.tokens_per_step,
            "train_loss": self.last_loss, "best_val": state.best_val, "lr": lr, "tok_per_sec": tok_s,
            "mfu": round(self.mfu(tok_s), 4), "elapsed_hours": round(elapsed / 3600, 3),
            "eta_hours": round(remaining / tok_s / 3600, 2) if tok_s else None,
            "peak_gb": torch.cuda.max_memory_allocated() / 2**30 if self.device.type == "cuda" else None,
            "skipped_steps": self.skipped_steps, "resumes": state.resumes, "finished": finished,
            "stop_reason": stop_reason})
        self.last_heartbeat = time.time()

    def close(self) -> None:
        self.bar.close()
