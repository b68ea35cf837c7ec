"""The night's core, one copy for every trainer of it: `hitoban pretrain` (training/pretrain/trainer.py), a
federated machine's inner steps (training/federated/inner.py), `hitoban calibrate` and the tiny-model helper.

Set-up (`new_model_and_optimizer`, `prepare`), the update (`update`: the step's LR, its dropout seed, the step of
training/step.py) and evaluation (`evaluate`). What differs between the trainers stays with them: where the rows
come from (the night's (seed, step) batches or a task's window range), what a resume restores (a checkpoint or a
machine's inner state) and what is saved.
"""

from __future__ import annotations

import numpy as np
import torch

from hitoban.modeling import HitobanForCausalLM
from hitoban.training.data.reader import ShardReader
from hitoban.training.nll import token_nats
from hitoban.training.optim import place_step_counters, set_lr
from hitoban.training.step import train_step


def step_seed(seed: int, step: int, rank: int) -> int:
    """The torch seed for one step on one process: a resumed run draws the same dropout masks as an uninterrupted
    one without saving any RNG state, on any number of processes."""
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1, np.uint64)[0])


def new_model_and_optimizer(config, options, schedule, muon_dtype: str, seed: int | None = None):
    """The model (initialised from `seed` when given; else the caller loads weights into it) and its optimizer at
    the schedule's first learning rate: `options` are the run's optimizer options (training/optimizer.py)."""
    if seed is not None:
        torch.manual_seed(seed)
    model = HitobanForCausalLM(config)
    return model, options.optimizer_for(model, schedule.lr(0), muon_dtype)


def prepare(accelerator, model, optimizer):
    """Accelerate's prepare (DDP over several processes), then each restored `step` counter where its optimizer
    reads it (prepare moves the whole state to the device)."""
    model, optimizer = accelerator.prepare(model, optimizer)
    place_step_counters(optimizer)
    return model, optimizer


def update(model, optimizer, accelerator, rows: np.ndarray, lr: float, dropout_seed: int | None, grad_accum: int,
           grad_clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One update at `lr` with dropout drawn from `dropout_seed` (both functions of the step, so a resumed or
    re-issued step is the same step; None: a model without dropout, the tiny helper's, leaves torch's generator
    alone); (loss, gradient norm) stay on the device."""
    set_lr(optimizer, lr)
    model.train()
    if dropout_seed is not None:
        torch.manual_seed(dropout_seed)
    return train_step(model, optimizer, accelerator, rows, grad_accum, grad_clip)


@torch.no_grad()
def evaluate(model, val: ShardReader | None, domains: dict[str, np.ndarray], batches: int, batch_size: int,
             context: int, autocast, accelerator=None) -> dict:
    """Fixed validation batches (seed 0, steps 0..n-1) plus per-domain loss on `domains` (built once per run).
    Over several processes each rank scores its share of the batches and windows and the sums are reduced: the
    same numbers as one process, in 1/world of the time."""
    if val is None:
        return {}
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator is not None else (0, 1)
    model.eval()
    device = next(model.parameters()).device
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    for i in range(rank, batches, world):
        rows = torch.from_numpy(val.batch(0, i, batch_size, context)).to(device)
        with autocast():
            loss_sum += model(rows, labels=rows).loss.float()
    per_domain = {}
    for domain, stream in domains.items():  # each token predicted once, as bits/char measures (training.nll)
        if len(stream):
            with autocast():
                nats = token_nats(model, stream, val.end_id, window=context, batch=batch_size, part=(rank, world))
            if world > 1:  # each rank filled its own windows and left the others at zero
                nats = accelerator.reduce(torch.from_numpy(nats).to(device), "sum").cpu().numpy()
            per_domain[domain] = float(nats.mean())
    if world > 1:
        loss_sum = accelerator.reduce(loss_sum, "sum")
    model.train()
    return {"val_loss": float(loss_sum) / batches, "val_domains": per_domain}


__all__ = ["evaluate", "new_model_and_optimizer", "prepare", "step_seed", "update"]
