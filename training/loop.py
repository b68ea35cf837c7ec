"""The parts of the pretraining loop that are not setup: one training step, the monitor, the checkpoint policy.

`training/pretrain.py` builds a run (data, model, optimizer, resume) and drives these three. The step leaves its
loss and gradient norm on the device: reading them every step would make the host wait for the accelerator each
step. The monitor reads them once per log window (and before every save), which is also where a non-finite loss is
caught: the window's updates are discarded and the last good checkpoint stays the run's state.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from hitoban.errors import ExitCode, HitobanError
from hitoban.provenance import write_json


class TrainingDiverged(HitobanError, RuntimeError):
    """Loss or gradient became NaN/inf; the last good checkpoint is untouched."""

    exit_code = ExitCode.DIVERGED


def train_step(model, optimizer, accelerator, rows: np.ndarray, grad_accum: int, grad_clip: float
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward, backward (over `grad_accum` micro-batches), clip, update. Returns (mean loss, gradient norm) as
    device tensors, unread. The LR and the dropout seed are the caller's: they are functions of the step."""
    micro = len(rows) // grad_accum
    device = accelerator.device
    loss_sum = torch.zeros((), device=device)
    for m in range(grad_accum):
        x = torch.from_numpy(rows[m * micro : (m + 1) * micro]).to(device, non_blocking=True)
        sync = accelerator.no_sync(model) if m < grad_accum - 1 else nullcontext()
        with sync, accelerator.autocast():
            loss = model(input_ids=x, labels=x).loss / grad_accum
            accelerator.backward(loss)
        loss_sum += loss.detach()
    grad_norm = accelerator.clip_grad_norm_(model.parameters(), grad_clip or float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, torch.as_tensor(grad_norm, device=device)


def step_outcome(loss: float, grad_norm: float, fp16: bool, skipped_in_a_row: int, max_skips: int = 20) -> str:
    """'ok', 'skipped' (fp16: the gradient scaler overflowed and skips this update, as it is meant to) or
    'diverged' (a non-finite loss, a non-finite gradient without fp16, or too many skips in a row)."""
    if not math.isfinite(loss):
        return "diverged"
    if math.isfinite(grad_norm):
        return "ok"
    if fp16 and skipped_in_a_row < max_skips:
        return "skipped"
    return "diverged"


def reset_accelerate_state(cpu: bool | None = None) -> None:
    """Accelerate keeps one state per process (mixed precision, gradient accumulation) and refuses a second
    Accelerator with another precision: a run after a Trainer (or a Trainer after a run) in one program would fail.
    A run owns that state while it trains. Its device is kept too, and a later `Accelerator(cpu=True)` silently
    runs on the earlier run's GPU: with `cpu` given (the device the next Accelerator must use), a single process's
    device state that does not match is reset as well. A process group's (torchrun) is never touched."""
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    if cpu is None or not PartialState._shared_state:
        return
    from hitoban.modeling.loading import device_for

    state = PartialState()
    if state.device.type != device_for(cpu).type and state.num_processes == 1:
        PartialState._reset_state()


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
    skipped_in_a_row: int = 0
    window_start: float = field(default_factory=time.time)
    last_heartbeat: float = 0.0

    def __post_init__(self) -> None:
        self.bar = tqdm(total=self.total_steps, initial=self.start_step, desc="pretrain", unit="step",
                        disable=not (self.main and self.progress) or None)
        self.first_unread_step = self.start_step + 1

    def log(self, record: dict) -> None:
        if self.main:
            with open(self.run / "log.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")

    def mfu(self, tok_per_sec: float) -> float:
        """Model FLOPs utilisation: the FLOPs the model needs per second over what the hardware can do."""
        return tok_per_sec * self.token_flops / self.peak_flops

    def on_step(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Record a finished step without reading the device. Under fp16 the gradient scaler has read it already
        (a skipped update is normal there), so its verdict is taken per step."""
        if self.fp16:
            outcome = step_outcome(float(loss), float(grad_norm), True, self.skipped_in_a_row)
            self.skipped_in_a_row = self.skipped_in_a_row + 1 if outcome == "skipped" else 0
            if outcome == "skipped":
                self.log({"type": "skip", "step": step, "reason": "fp16 gradient overflow (the scaler lowers its "
                                                                  "scale)"})
            finite = torch.tensor(outcome != "diverged", device=loss.device)
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
            return
        kept = (f"the last good checkpoint (step {last_saved_step}) is untouched and the run resumes from it"
                if last_saved_step >= 0 else "no checkpoint had been written yet")
        loss = float(self.loss_sum) / max(1, self.window_steps) if self.loss_sum is not None else float("nan")
        raise TrainingDiverged(f"the loss or the gradient became non-finite between steps {self.first_unread_step} "
                               f"and {step} (mean loss {loss}, last grad norm {float(self.last_grad_norm)}); "
                               f"those updates were discarded: {kept}. Lower --lr (resume with --allow-change lr) "
                               "or check the data")

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
        write_json(self.run / "heartbeat.json", {
            "updated_at": time.time(), "step": state.step, "total_steps": self.total_steps,
            "tokens_seen": state.tokens_seen, "token_budget": self.total_steps * self.tokens_per_step,
            "train_loss": self.last_loss, "best_val": state.best_val, "lr": lr, "tok_per_sec": tok_s,
            "mfu": round(self.mfu(tok_s), 4), "elapsed_hours": round(elapsed / 3600, 3),
            "eta_hours": round(remaining / tok_s / 3600, 2) if tok_s else None,
            "peak_gb": torch.cuda.max_memory_allocated() / 2**30 if self.device.type == "cuda" else None,
            "resumes": state.resumes, "finished": finished, "stop_reason": stop_reason})
        self.last_heartbeat = time.time()

    def close(self) -> None:
        self.bar.close()


class StopFlag:
    """First SIGINT/SIGTERM: stop at the next step boundary (after saving). Second: exit now."""

    def __init__(self):
        self.reason: str | None = None

    def install(self) -> None:
        def handler(signum, frame):
            if self.reason is not None:
                os._exit(128 + signum)
            self.reason = f"signal {signal.Signals(signum).name}"
            print(f"\n{signal.Signals(signum).name}: saving at the next step boundary (again to quit now)", flush=True)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, handler)


CLOCK_SKEW_ENV = "HITOBAN_TEST_CLOCK_SKEW"  # test hook: "RANK:SECONDS" adds SECONDS to that rank's clock
INF_LOSS_ENV = "HITOBAN_TEST_INF_LOSS"  # test hook: "RANK:STEP" makes that rank's loss at that step infinite


def clock_skew(rank: int) -> float:
    target, _, seconds = os.environ.get(CLOCK_SKEW_ENV, "").partition(":")
    return float(seconds) if target and int(target) == rank else 0.0


def planted_inf_step(rank: int) -> int | None:
    """The step at which INF_LOSS_ENV plants an infinite loss on this rank, if it does (read once per run)."""
    target, _, at = os.environ.get(INF_LOSS_ENV, "").partition(":")
    return int(at) if target and int(target) == rank else None


_HOST_GROUP: list = []  # the gloo group for host-side decisions, made once per process group


def host_group():
    """A process group whose collectives run on host memory (gloo): a flag reduced over it never makes the host
    wait for the GPU. Over NCCL, whose collectives take device tensors, reading a shared flag every step would
    synchronise the host with the device's queue every step. None: the default group is gloo already."""
    import torch.distributed as dist

    if dist.get_backend() == "gloo":
        return None
    if not _HOST_GROUP:
        _HOST_GROUP.append(dist.new_group(backend="gloo"))  # every rank reaches this at the same step
    return _HOST_GROUP[0]


def shared_any(accelerator, *flags: bool) -> list[bool]:
    """One decision for every process: a flag true on any rank is true on all. Each rank has its own clock,
    signals and timers, and a save or a stop taken by one rank alone leaves the others waiting in a collective
    that never comes (a hang). The flags travel as a host tensor over `host_group` (no device sync)."""
    if accelerator.num_processes == 1:
        return [bool(f) for f in flags]
    import torch.distributed as dist

    tensor = torch.tensor([float(f) for f in flags])
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=host_group())
    return [bool(v) for v in tensor.tolist()]


@dataclass
class CheckpointPolicy:
    """When to save and when to stop: every N steps, every M minutes, on a signal, past --max-hours, at the end.
    Time and signals are per process, so each decision is shared (any rank's yes is everyone's)."""

    save_every_steps: int | None
    save_every_min: float
    max_hours: float | None
    total_steps: int
    stop: StopFlag = field(default_factory=StopFlag)
    last_save: float = field(default_factory=time.time)
    last_saved_step: int = -1
    stop_reason: str | None = None

    def after_step(self, done: int, elapsed: float, accelerator) -> bool:
        """True when the state after step `done` must be saved now; sets `stop_reason` when the run must stop."""
        over_time = bool(self.max_hours) and elapsed > self.max_hours * 3600
        over_time, signalled, save_time = shared_any(accelerator, over_time, self.stop.reason is not None,
                                                     time.time() - self.last_save > self.save_every_min * 60)
        if over_time:
            self.stop_reason = "max_hours"
        if signalled:
            self.stop_reason = self.stop.reason or "signal (another process)"
        due = bool(self.save_every_steps and done % self.save_every_steps == 0) or save_time
        return bool(due or self.stop_reason or done == self.total_steps) and self.last_saved_step != done

    def saved(self, step: int) -> None:
        self.last_save, self.last_saved_step = time.time(), step
