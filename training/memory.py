"""What a training step holds in memory, estimated before it runs, and what a run may use: one rule for the night's
preflight, `hitoban calibrate` and a federated machine's, and the doctor's check of the estimate against a peak."""

from __future__ import annotations

import torch

from hitoban.modeling import HitobanConfig
from hitoban.training.hardware import available_memory_bytes, parameter_count


def estimate_memory_bytes(config: HitobanConfig, micro_batch: int, context: int, precision: str = "no") -> int:
    """Weights + grads + Adam m, v (fp32: 16 bytes a parameter) + activations (~34 values per hidden unit per layer)
    + the B x T x V logits: in fp32, the logits, the loss's fp32 log-softmax and its saved gradient (12 bytes an
    entry); under bf16/fp16 the half logits and half gradient beside those, and the fp32 copy of the logits that
    Accelerate's `convert_outputs_to_fp32` makes of the model's output (16 bytes an entry)."""
    activations = micro_batch * context * config.hidden_size * config.num_hidden_layers * 34 * 4
    return parameter_count(config) * 16 + activations + logits_bytes(config, micro_batch, context, precision)


def logits_bytes(config: HitobanConfig, micro_batch: int, context: int, precision: str = "no") -> int:
    """The estimate's logits term (see `estimate_memory_bytes`)."""
    return micro_batch * context * config.vocab_size * (16 if precision in ("bf16", "fp16") else 12)


def memory_limit(device: torch.device, cap_gb: float | None = None) -> tuple[int | None, str]:
    """(bytes a run may use on `device`, what that number is): the free memory, or `cap_gb` where that is lower;
    (None, "") where neither is known (no psutil on a CPU): no preflight rather than a wrong one."""
    limits = [(available_memory_bytes(device), "free"),
              (cap_gb * 2**30 if cap_gb else None, "allowed by --memory-cap-gb")]
    return min(((b, w) for b, w in limits if b is not None), default=(None, ""))


def fits(need: int, have: int) -> bool:
    """A step fits in 90% of what it may use: the rest is the allocator's fragmentation and the runtime's own."""
    return need <= 0.9 * have
