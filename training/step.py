"""One training step, and the process-level Accelerate state a run owns while it trains.

The night (`training/pretrain/trainer.py`), `hitoban calibrate`, the benchmarks and the tiny-model helper all run
this same step, so a measured tok/s is the night's tok/s. The step leaves its loss and gradient norm on the device:
reading them every step would make the host wait for the accelerator each step (the night's monitor reads them
once per log window).
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState, PartialState

from hitoban.modeling.loading import device_for


def train_step(model, optimizer, accelerator, rows: np.ndarray, grad_accum: int, grad_clip: float
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward, backward (over `grad_accum` micro-batches), clip, update. Returns (mean loss, gradient norm) as
    device tensors, unread. The LR and the dropout seed are the caller's: they are functions of the step."""
    micro = len(rows) // grad_accum
    device = accelerator.device
    loss_sum = torch.zeros((), device=device)
    for m in range(grad_accum):
        x = to_device(rows[m * micro : (m + 1) * micro], device)
        sync = accelerator.no_sync(model) if m < grad_accum - 1 else nullcontext()
        with sync, accelerator.autocast():
            loss = model(input_ids=x, labels=x).loss / grad_accum
            accelerator.backward(loss)
        loss_sum += loss.detach()
    grad_norm = accelerator.clip_grad_norm_(model.parameters(), grad_clip or float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, torch.as_tensor(grad_norm, device=device)


def copies_without_waiting(device: torch.device) -> bool:
    """Whether a host-to-device copy of a batch may be queued without waiting for it (`non_blocking`). Only CUDA:
    from pageable memory (a numpy buffer) CUDA stages the bytes before the call returns, so the caller may free the
    buffer at once. MPS reads the host buffer when the queued copy runs, after the caller may have freed it
    (pytorch issue 189690: a batch read from freed storage); a CPU has nothing to wait for."""
    return device.type == "cuda"


def to_device(rows: np.ndarray, device: torch.device) -> torch.Tensor:
    """A batch on the device, from host memory the caller may free as soon as this returns."""
    return torch.from_numpy(rows).to(device, non_blocking=copies_without_waiting(device))


def make_accelerator(cpu: bool, precision: str):
    """The run's `Accelerator` in `precision` ("no", "bf16", "fp16"). fp16 always comes with a gradient scaler,
    whose state a checkpoint keeps: Accelerate makes one on GPUs. Accelerate makes none on a CPU (no autocast
    either), where `check_precision` refuses fp16 and `auto` never picks it; a CPU reaches this only as the tests'
    stand-in for a T4 (fp16 autocast with torch's CPU GradScaler), so the scaler's save, resume and skipped steps
    run on a CPU too."""
    accelerator = Accelerator(cpu=cpu, mixed_precision=precision)
    if precision == "fp16" and accelerator.scaler is None and accelerator.device.type == "cpu":
        accelerator.scaler = torch.amp.GradScaler("cpu")
        accelerator.native_amp = True  # Accelerate's autocast(): fp16 autocast on the CPU
    return accelerator


def reset_accelerate_state(cpu: bool | None = None) -> None:
    """Accelerate keeps one state per process (mixed precision, gradient accumulation) and refuses a second
    Accelerator with another precision: a run after a Trainer (or a Trainer after a run) in one program would fail.
    A run owns that state while it trains. Its device is kept too, and a later `Accelerator(cpu=True)` silently
    runs on the earlier run's GPU: with `cpu` given (the device the next Accelerator must use), a single process's
    device state that does not match is reset as well. A process group's (torchrun) is never touched."""
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    if cpu is None or not PartialState._shared_state:
        return

    state = PartialState()
    if state.device.type != device_for(cpu).type and state.num_processes == 1:
        PartialState._reset_state()
