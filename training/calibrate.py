"""`hitoban calibrate`: measure real training throughput per candidate and size the night's budget (3LM §7).

For each (preset, batch) candidate: a fresh model and AdamW, warm-up steps untimed, then timed real steps
(forward, backward, clip, update) on real batches; tokens in the night = tok/s x hours x 0.9 (10% kept for
eval and saves); D/N = tokens / non-embedding parameters. The candidate closest to D/N 20 (Chinchilla) wins and
its exact `hitoban pretrain` command is printed.
"""

from __future__ import annotations

import resource
import time

import numpy as np
import torch

from hitoban.modeling import HitobanConfig, HitobanForCausalLM
from hitoban.training.hardware import default_precision, device_for
from hitoban.training.optim import AdamW

DEFAULT_CANDIDATES = ["tiny:8", "small:16", "3lm:24", "3lm:32", "3lm:48", "zxell-s:16"]


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels: CUDA and MPS run asynchronously, so a clock read without this times the queueing."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def memory_gb(device: torch.device) -> tuple[float, str]:
    """(GiB, what the number is): a true peak on CUDA and CPU; MPS has no peak counter, so its value is the
    memory the driver holds *now*, labelled as such."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30, "peak"
    if device.type == "mps":
        return torch.mps.driver_allocated_memory() / 2**30, "current (MPS has no peak counter)"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "peak RSS"  # Linux: KiB


STABLE_SPREAD = 0.10  # interquartile range of the step times / median


def measure(preset: str, batch: int, vocab_size: int, context: int | None, steps: int, warmup: int,
            device: torch.device, data=None, precision: str = "no", max_seconds: float = 60.0) -> dict:
    config = HitobanConfig.from_preset(preset, vocab_size=vocab_size)
    context = context or config.max_position_embeddings
    config.max_position_embeddings = max(config.max_position_embeddings, context)
    torch.manual_seed(0)
    model = HitobanForCausalLM(config).to(device).train()
    optimizer = AdamW(model.parameters(), lr=3e-4)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    dtype = torch.bfloat16 if precision == "bf16" else None

    def step(i: int) -> None:
        rows = (data.batch(0, i, batch, context) if data is not None
                else np.random.default_rng([0, i]).integers(0, vocab_size, (batch, context + 1)))
        x = torch.from_numpy(rows).to(device)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = model(x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for i in range(warmup):
        step(i)
    synchronize(device)
    times = time_steps(step, warmup, steps, device, max_seconds)
    median = float(np.median(times))
    q25, q75 = (float(q) for q in np.percentile(times, [25, 75]))
    memory, memory_kind = memory_gb(device)
    params = sum(p.numel() for p in model.parameters())
    non_embedding = params - model.model.embed_tokens.weight.numel()
    return {"label": f"{preset} b{batch}", "preset": preset, "batch": batch, "context": context, "params": params,
            "non_embedding": non_embedding, "tokens_per_step": batch * context,
            "tok_per_sec": batch * context / median, "tok_per_sec_range": [batch * context / q75,
                                                                           batch * context / q25],
            "spread": round((q75 - q25) / median, 4), "steps_timed": len(times), "peak_gb": memory,
            "memory_kind": memory_kind}


def time_steps(step, first: int, steps: int, device: torch.device, max_seconds: float) -> list[float]:
    """Seconds per step, one step at a time: at least `steps`, and more while the middle half of the times spreads
    over more than 10% of the median (a busy machine, a slow first kernel), until `max_seconds`. The median
    ignores the outliers a mean of a few steps would swallow."""
    times: list[float] = []
    deadline = time.perf_counter() + max_seconds
    i = first
    while len(times) < steps or (_spread(times) > STABLE_SPREAD and time.perf_counter() < deadline):
        start = time.perf_counter()
        step(i)
        synchronize(device)
        times.append(time.perf_counter() - start)
        i += 1
    return times


def _spread(times: list[float]) -> float:
    q25, median, q75 = np.percentile(times, [25, 50, 75])
    return float((q75 - q25) / median)


def calibrate(candidates: list[str], hours: float = 8.0, data_dir: str | None = None, vocab_size: int = 32000,
              context: int | None = None, steps: int = 10, warmup: int = 3, cpu: bool = False,
              precision: str = "auto", log=print) -> dict:
    from hitoban.training.data import ShardReader

    device = device_for(cpu)
    if precision == "auto":
        precision = default_precision(device.type)
    data = ShardReader(data_dir) if data_dir else None
    if data is not None:
        vocab_size = data.vocab_size
    usable = hours * 3600 * 0.9
    results = []
    for candidate in candidates:
        preset, _, batch = candidate.partition(":")
        row = measure(preset, int(batch or 32), vocab_size, context, steps, warmup, device, data, precision)
        row["tokens_in_budget"] = int(row["tok_per_sec"] * usable)
        row["tokens_in_budget_range"] = [int(v * usable) for v in row["tok_per_sec_range"]]
        row["d_over_n"] = row["tokens_in_budget"] / row["non_embedding"]
        row["steps_in_budget"] = row["tokens_in_budget"] // row["tokens_per_step"]
        results.append(row)
        log(f"  {row['label']:<14} {row['params'] / 1e6:7.2f}M {row['non_embedding'] / 1e6:7.2f}M "
            f"{row['tok_per_sec']:>10,.0f} tok/s ±{row['spread'] / 2:4.0%} {row['peak_gb']:6.2f} GB "
            f"{row['tokens_in_budget']:>15,} tokens D/N {row['d_over_n']:7.1f} {row['steps_in_budget']:>9,} steps "
            f"({row['steps_timed']} steps timed)")
    best = min(results, key=lambda r: abs(r["d_over_n"] - 20))
    command = (f"hitoban pretrain --data {data_dir or 'SHARDS'} --out runs/night --preset {best['preset']} "
               f"--batch-size {best['batch']} --context {best['context']} --tokens {best['tokens_in_budget']} "
               f"--max-hours {hours + 0.5:g} --supervise")
    low, high = best["tokens_in_budget_range"]
    sureness = (f"{best['tok_per_sec']:,.0f} tok/s (middle half of {best['steps_timed']} timed steps: "
                f"{best['tok_per_sec_range'][0]:,.0f}-{best['tok_per_sec_range'][1]:,.0f}), so the night holds "
                f"{low:,}-{high:,} tokens" + ("" if best["spread"] <= STABLE_SPREAD else
                                              "; the timings did not settle (a busy machine?): calibrate again"))
    return {"hours": hours, "usable_seconds": usable, "device": device.type, "precision": precision,
            "sureness": sureness,
            "vocab_size": vocab_size, "measured_steps": steps, "warmup_steps": warmup, "results": results,
            "selected": best["label"], "command": command}
