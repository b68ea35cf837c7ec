"""A tiny model trained in memory in seconds: `hitoban doctor`'s smoke test and the PII probe's canary models.

Both run the night's own update (`training/night.py` through Accelerate, as `hitoban calibrate` does) on windows drawn
from one token stream as a pure function of (seed, step), on the night's schedule: a short warmup, then a cosine
decay to zero.
"""

from __future__ import annotations

import numpy as np
import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from hitoban.modeling import HitobanConfig, HitobanForCausalLM
from hitoban.training import night
from hitoban.training.schedule import Schedule
from hitoban.training.step import reset_accelerate_state


def token_stream(tokenizer, documents: list[str]) -> np.ndarray:
    """Every document's ids followed by the document separator (eos), concatenated."""
    encoded = tokenizer.backend_tokenizer.encode_batch(documents)  # whole documents: no model_max_length warning
    return np.array([i for enc in encoded for i in enc.ids + [tokenizer.eos_token_id]], dtype=np.int64)


def windows(stream: np.ndarray, seed: int, step: int, batch: int, context: int) -> np.ndarray:
    """`batch` random windows of `context` + 1 tokens: a pure function of (seed, step)."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(stream) - context - 1, size=batch)
    return np.stack([stream[s : s + context + 1] for s in starts])


def train_tiny(stream: np.ndarray, vocab_size: int, steps: int, seed: int, context: int = 128, batch: int = 16,
               lr: float = 3e-3, warmup: int = 20, max_positions: int = 256, desc: str = "train"
               ) -> tuple[HitobanForCausalLM, list[float]]:
    """The `tiny` preset trained for `steps` on `stream` on the CPU (AdamW, clip 1.0); returns (model in eval mode,
    the loss of every step)."""
    if len(stream) <= context + 1:
        raise ValueError(f"the token stream ({len(stream)} tokens) is shorter than one window of {context + 1}")
    torch.manual_seed(seed)
    config = HitobanConfig.from_preset("tiny", vocab_size=vocab_size, max_position_embeddings=max_positions)
    model = HitobanForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    reset_accelerate_state(cpu=True)
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    schedule = Schedule(lr, steps, "cosine", warmup_frac=0.0, min_ratio=0.0, warmup_steps=warmup)
    losses = []
    try:
        for step in tqdm(range(steps), desc=desc, disable=None):
            loss, _ = night.update(model, optimizer, accelerator, windows(stream, seed, step, batch, context),
                                   schedule.lr(step), None, 1, 1.0)
            losses.append(loss.item())
    finally:
        reset_accelerate_state()
    return accelerator.unwrap_model(model).eval(), losses
