"""Optimizer and learning-rate schedule for pretraining (SPEC §5, 3LM §4.2).

The schedule is built for exactly the budget: linear warmup over max(100, 2%) of the steps from 2% of the peak,
then cosine to 10% of the peak at the last step. (3LM's predecessor stopped on a time cap before its cosine had
decayed; a schedule sized to the real budget cannot.)

AdamW: torch's `AdamW` with bias correction by default. 3LM's MLX AdamW had no bias correction, which torch cannot
switch off, so `AdamW(bias_correction=False)` is a small subclass doing exactly that update; both keep torch's state
layout (`step`, `exp_avg`, `exp_avg_sq`), so checkpoints and resume treat them alike. Without bias correction the
first updates are ~10x smaller (m starts at 0.1·g), which acts as an extra implicit warmup.
"""

from __future__ import annotations

import math

import torch


def lr_at(step: int, total_steps: int, peak: float, warmup_frac: float = 0.02, min_ratio: float = 0.1) -> float:
    """LR for the update made after `step` updates (3LM: update k uses lr_at(k - 1))."""
    warmup = min(max(100, int(total_steps * warmup_frac)), max(1, total_steps - 1))
    floor = peak * min_ratio
    if step < warmup:
        return peak * 0.02 + (peak - peak * 0.02) * step / warmup
    span = max(1, total_steps - warmup)
    progress = min(step - warmup, span) / span
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))


class AdamW(torch.optim.AdamW):
    """torch AdamW, plus `bias_correction=False` for 3LM's MLX semantics (decay on every parameter)."""

    def __init__(self, params, lr: float = 6e-4, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.1,
                 bias_correction: bool = True):
        # foreach=None: torch's multi-tensor kernels where they exist (CUDA), the per-parameter loop on the CPU, so
        # CPU results stay bit-identical across runs and resumes
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=None)
        self.bias_correction = bias_correction

    @torch.no_grad()
    def step(self, closure=None):
        if self.bias_correction:
            return super().step(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                p.mul_(1 - group["lr"] * group["weight_decay"])
                state["exp_avg"].lerp_(p.grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                p.addcdiv_(state["exp_avg"], state["exp_avg_sq"].sqrt().add_(group["eps"]), value=-group["lr"])
        return None
