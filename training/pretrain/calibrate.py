"""`hitoban calibrate`: measure real training throughput per candidate and size the night's budget (docs/design.md §9).

For each (preset, batch) candidate: a fresh model and the night's optimizer (Muon unless told), warm-up steps
untimed, then timed real steps (the night's `train_step`: forward, backward, clip, update) on real batches; tokens
in the night = tok/s x hours x HOURS_USABLE (10% kept for eval and saves); D/N = tokens / non-embedding parameters.
The candidate closest to D/N 20 (Chinchilla) wins and its exact `hitoban pretrain` command is printed. A candidate
whose step the night's memory preflight would refuse (estimate against free memory or --memory-cap-gb) is listed as
not fitting and not measured: measured, it would die with out-of-memory and take the table with it.
"""

from __future__ import annotations

import platform
import resource
import time
from pathlib import Path

import numpy as np
import torch

from hitoban.errors import ResourceError
from hitoban.modeling import HitobanForCausalLM
from hitoban.options import argv_for
from hitoban.provenance import write_json
from hitoban.training import night
from hitoban.training.data.reader import ShardReader
from hitoban.training.device import set_up
from hitoban.training.hardware import (
    choose_compile,
    measured_once,
    synchronize,
)
from hitoban.training.memory import estimate_memory_bytes, fits, memory_limit
from hitoban.training.optim import build_optimizer
from hitoban.training.pretrain.options import CalibrateOptions, PretrainConfig, shaped_config
from hitoban.training.step import reset_accelerate_state

HOURS_USABLE = 0.9  # of a night: the rest is kept for evaluations, saves and the start


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
            accelerator, data=None, max_seconds: float = 60.0, compiled: bool = False,
            optimizer_name: str = "muon", grad_accum: int = 1, muon_dtype: str = "bfloat16") -> dict:
    """tok/s of the real training step (`night.update`: the night's forward, backward, clip, update) for one
    process's `batch` rows in `grad_accum` micro-batches (the memory a step needs is a micro-batch's), in the
    accelerator's precision; compile time (the first steps) is excluded."""
    device = accelerator.device
    config, context = shaped_config(preset, vocab_size, context)
    torch.manual_seed(0)
    model = HitobanForCausalLM(config).to(device).train()
    # Muon's Newton-Schulz, in the dtype the run will use, is part of the step's cost
    optimizer = build_optimizer(model, optimizer_name, lr=3e-4, muon_dtype=muon_dtype)
    step_model = torch.compile(model) if compiled else model
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def step(i: int) -> None:
        rows = (data.batch(0, i, batch, context) if data is not None
                else np.random.default_rng([0, i]).integers(0, vocab_size, (batch, context + 1)))
        night.update(step_model, optimizer, accelerator, rows, 3e-4, i, grad_accum, 1.0)  # the night's update

    first = time.perf_counter()
    for i in range(warmup):
        step(i)
    synchronize(device)
    warmup_seconds = time.perf_counter() - first
    times = time_steps(step, warmup, steps, device, max_seconds)
    median = float(np.median(times))
    q25, q75 = (float(q) for q in np.percentile(times, [25, 75]))
    memory, memory_kind = memory_gb(device)
    params, non_embedding = model.num_parameters(), model.num_parameters(exclude_embeddings=True)
    return {"label": f"{preset} b{batch}", "preset": preset, "batch": batch, "context": context, "params": params,
            "non_embedding": non_embedding, "tokens_per_step": batch * context, "step_seconds": median,
            "warmup_seconds": warmup_seconds, "compiled": compiled,
            "tok_per_sec": batch * context / median, "tok_per_sec_range": [batch * context / q75,
                                                                           batch * context / q25],
            "spread": round((q75 - q25) / median, 4), "steps_timed": len(times), "peak_gb": memory,
            "memory_kind": memory_kind}


COMPILE_CACHE = Path.home() / ".cache" / "hitoban" / "compile_gain.json"


def compile_gain(preset: str, batch: int, vocab_size: int, context: int, accelerator, data=None,
                 optimizer: str = "muon", muon_dtype: str = "bfloat16", cache: Path = COMPILE_CACHE,
                 log=print) -> dict:
    """What torch.compile buys this shape on this machine: eager and compiled step times and the compile time
    (first compiled steps minus eager ones). Measured once per machine, shape, precision and torch (a minute or
    two on a CPU), then cached: `--compile auto` decides from it."""
    key = (f"{accelerator.device.type}|{platform.processor() or platform.machine()}|{torch.get_num_threads()} "
           f"threads|torch {torch.__version__}|{preset} b{batch} ctx{context} vocab{vocab_size}|"
           f"{accelerator.mixed_precision}|{optimizer}|{muon_dtype}")

    def measure_both() -> dict:
        log(f"# measuring torch.compile on this machine once ({preset} b{batch}); cached in {cache}")
        eager = measure(preset, batch, vocab_size, context, 5, 2, accelerator, data, 30, optimizer_name=optimizer,
                        muon_dtype=muon_dtype)
        compiled = measure(preset, batch, vocab_size, context, 5, 2, accelerator, data, 30, compiled=True,
                           optimizer_name=optimizer, muon_dtype=muon_dtype)
        return {"eager_step_s": eager["step_seconds"], "compiled_step_s": compiled["step_seconds"],
                "compile_s": max(0.0, compiled["warmup_seconds"] - eager["warmup_seconds"])}

    return measured_once(cache, key, measure_both)


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


def calibrate(options: CalibrateOptions, log=print) -> dict:
    """Measure each "PRESET:BATCH" candidate with the real training step and pick the night's run; with
    `options.out`, also write the result there as JSON."""
    reset_accelerate_state(cpu=options.cpu)
    chosen = set_up(options.cpu, options.precision)  # the night's own device resolution
    facts, plan, precision, accelerator = chosen.facts, chosen.plan, chosen.precision, chosen.accelerator
    device = accelerator.device
    data = ShardReader(options.data) if options.data else None
    vocab_size = data.vocab_size if data is not None else options.vocab_size
    usable = options.hours * 3600 * HOURS_USABLE
    results, skipped = [], []
    have, what = memory_limit(device, options.memory_cap_gb)
    for candidate in options.candidate:
        preset, _, batch = candidate.partition(":")
        batch = int(batch or 32)
        config, context = shaped_config(preset, vocab_size, options.context)
        need = estimate_memory_bytes(config, batch, context, precision)
        if have is not None and not fits(need, have):
            skipped.append({"label": f"{preset} b{batch}", "estimate_gb": round(need / 2**30, 2),
                            "limit_gb": round(have / 2**30, 2), "limit": what})
            log(f"  {preset + ' b' + str(batch):<14} does not fit: needs about {need / 2**30:.2f} GiB, "
                f"{have / 2**30:.2f} GiB {what} (skipped)")
            continue
        compiled, _ = choose_compile(options.compile, facts, usable, lambda preset=preset, batch=batch: compile_gain(
            preset, batch, vocab_size, options.context, accelerator, data, options.optimizer, plan.muon_dtype))
        row = measure(preset, batch, vocab_size, options.context, options.steps, options.warmup, accelerator, data,
                      max_seconds=options.max_seconds, compiled=compiled, optimizer_name=options.optimizer,
                      muon_dtype=plan.muon_dtype)
        row["tokens_in_budget"] = int(row["tok_per_sec"] * usable)
        row["tokens_in_budget_range"] = [int(v * usable) for v in row["tok_per_sec_range"]]
        row["d_over_n"] = row["tokens_in_budget"] / row["non_embedding"]
        row["steps_in_budget"] = row["tokens_in_budget"] // row["tokens_per_step"]
        results.append(row)
        log(f"  {row['label']:<14} {row['params'] / 1e6:7.2f}M {row['non_embedding'] / 1e6:7.2f}M "
            f"{row['tok_per_sec']:>10,.0f} tok/s ±{row['spread'] / 2:4.0%} {row['peak_gb']:6.2f} GB "
            f"{row['tokens_in_budget']:>15,} tokens D/N {row['d_over_n']:7.1f} {row['steps_in_budget']:>9,} steps "
            f"({row['steps_timed']} steps timed)")
    if not results:
        needs = ", ".join(f"{r['label']} needs {r['estimate_gb']} GiB" for r in skipped)
        raise ResourceError(f"none of the candidates fits on {device.type} ({needs}; {have / 2**30:.2f} GiB "
                            f"{what}): give smaller ones, e.g. --candidate tiny:8 --candidate small:8")
    best = min(results, key=lambda r: abs(r["d_over_n"] - 20))
    pretrain_argv = argv_for(PretrainConfig, data=options.data or "SHARDS", out="runs/night", preset=best["preset"],
                     batch_size=best["batch"], context=best["context"], tokens=best["tokens_in_budget"],
                     max_hours=f"{options.hours + 0.5:g}")
    command = " ".join(["hitoban", "pretrain", *pretrain_argv, "--supervise"])
    low, high = best["tokens_in_budget_range"]
    sureness = (f"{best['tok_per_sec']:,.0f} tok/s (middle half of {best['steps_timed']} timed steps: "
                f"{best['tok_per_sec_range'][0]:,.0f}-{best['tok_per_sec_range'][1]:,.0f}), so the night holds "
                f"{low:,}-{high:,} tokens" + ("" if best["spread"] <= STABLE_SPREAD else
                                              "; the timings did not settle (a busy machine?): calibrate again"))
    reset_accelerate_state(cpu=options.cpu)
    result = {"kind": "calibration", "schema": 1, "hours": options.hours, "usable_seconds": usable,
              "device": device.type, "precision": precision, "device_plan": plan.record(),
              "sureness": sureness, "vocab_size": vocab_size, "measured_steps": options.steps,
              "warmup_steps": options.warmup, "results": results, "skipped": skipped, "selected": best["label"],
              "command": command}
    if options.out:
        write_json(options.out, result)
    return result
