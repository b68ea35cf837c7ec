"""What a night can afford: its step budget from `--hours`, and the memory a step needs against what is there.

Both are measured or estimated on this very shape, precision and device before the first real step, so a night
that cannot fit, or cannot finish, says so at once rather than at 3 a.m.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from hitoban.errors import ResourceError
from hitoban.modeling import HitobanConfig, HitobanForCausalLM
from hitoban.training.data.reader import ShardReader
from hitoban.training.device import DeviceOptions
from hitoban.training.memory import (  # noqa: F401 - the preflight's rule, importable from here too
    estimate_memory_bytes,
    fits,
    logits_bytes,
    memory_limit,
)
from hitoban.training.optim import build_optimizer
from hitoban.training.pretrain.calibrate import HOURS_USABLE, measure
from hitoban.training.pretrain.checkpoint import TrainState, current_slot
from hitoban.training.pretrain.options import PretrainConfig
from hitoban.training.step import train_step


def steps_for_hours(cfg: PretrainConfig, run: Path, accelerator, train: ShardReader, context: int,
                    compiled: bool, muon_dtype: str = "bfloat16", started: float | None = None) -> int:
    """--hours: the step budget whose schedule ends `cfg.hours` after the night started at `started` (default: now;
    reading the shards, building the model and this measurement already count), from tok/s measured on this very
    shape, precision, device and compile choice (warm steps only, as `hitoban calibrate`). A resumed run keeps the
    budget it was sized with: the schedule must not change under it."""
    slot = current_slot(run) if cfg.resume == "auto" and run.exists() else None
    steps = TrainState.read(slot).fingerprint.get("total_steps") if slot is not None else None
    if steps is not None:
        print(f"# --hours: keeping this run's budget of {steps:,} steps", flush=True)
        return steps
    world = accelerator.num_processes
    row = measure(cfg.preset, cfg.batch_size // world, train.vocab_size, context, steps=10, warmup=3,
                  accelerator=accelerator, data=train, max_seconds=30, compiled=compiled, optimizer_name=cfg.optimizer,
                  grad_accum=cfg.grad_accum, muon_dtype=muon_dtype)
    spent = time.time() - (started or time.time())  # setting up and measuring: part of the night
    seconds = max(0.0, cfg.hours * 3600 - spent) * HOURS_USABLE
    steps = torch.tensor(max(1, int(row["tok_per_sec"] * world * seconds) // (cfg.batch_size * context)),
                         device=accelerator.device)
    if world > 1:  # one budget for every rank: the slowest measurement decides

        dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    print(f"# --hours {cfg.hours:g}: {row['tok_per_sec'] * world:,.0f} tok/s measured -> {int(steps):,} steps "
          f"({spent:.0f} s spent starting and measuring; {HOURS_USABLE:.0%} of the rest trains, the remainder is kept "
          "for evaluations and saves)", flush=True)
    return int(steps)


def step_peak_bytes(config: HitobanConfig, micro_batch: int, context: int, accelerator, optimizer_name: str = "muon",
                    muon_dtype: str = "bfloat16") -> tuple[int | None, str]:
    """(bytes, how measured): the memory a fresh model of `config` and two of the night's training steps take at
    their peak, beyond what was allocated before: what `estimate_memory_bytes` estimates. None where nothing
    measures it (MPS has no peak counter), with the reason.

    CUDA: a warm-up step on a throwaway model first, then the caching allocator's peak. cuBLAS's workspaces (32 MiB a
    handle on compute capability 9.x, one handle for the forward's thread and one for autograd's) come from that
    allocator and stay: made inside the window, they would be held against an estimate of the night's own tensors,
    and so would the 8192^2 matmuls that measure an unknown GPU's peak. CPU: the profiler's memory timeline (its
    private reader; where it fails, no number)."""
    device = accelerator.device
    if device.type not in ("cuda", "cpu"):
        return None, f"no allocator peak on {device.type}"

    def rows(step: int, vocab: int) -> np.ndarray:
        return np.random.default_rng([0, step]).integers(0, vocab, (micro_batch, context + 1))

    def steps(model_config: HitobanConfig, prepare: bool, count: int) -> None:
        torch.manual_seed(0)
        model = HitobanForCausalLM(model_config).to(device).train()
        model = accelerator.prepare_model(model) if prepare else model
        optimizer = build_optimizer(model, optimizer_name, lr=3e-4, muon_dtype=muon_dtype)
        for step in range(count):
            train_step(model, optimizer, accelerator, rows(step, model_config.vocab_size), 1, 1.0)

    if device.type == "cuda":
        steps(HitobanConfig(**{**config.to_dict(), "vocab_size": 256}), prepare=False, count=1)  # the workspaces
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        steps(config, prepare=True, count=2)
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before, "CUDA allocator peak after a warm-up step"

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as run:
        steps(config, prepare=True, count=2)
    try:
        from torch.profiler._memory_profiler import MemoryProfileTimeline

        _, sizes = MemoryProfileTimeline(run._memory_profile())._coalesce_timeline("cpu")
    except Exception as error:  # noqa: BLE001 - a private reader: its failure is "not measured", never a pass
        return None, f"the profiler's memory timeline failed ({type(error).__name__})"
    return max(sum(s) for s in sizes), "profiler memory timeline"


def memory_preflight(options: DeviceOptions, config: HitobanConfig, device: torch.device, micro: int, context: int,
                     precision: str) -> None:
    """Refuse a run whose estimate exceeds what it may use: free memory, or --memory-cap-gb when that is lower
    (`options`: the run's device options, which own the cap and the check's switch)."""
    if device.type in ("cuda", "mps") and options.memory_cap_gb:
        total = (torch.cuda.get_device_properties(device).total_memory if device.type == "cuda"
                 else torch.mps.recommended_max_memory())
        fraction = min(1.0, options.memory_cap_gb * 2**30 / total)
        (torch.cuda if device.type == "cuda" else torch.mps).set_per_process_memory_fraction(fraction)
    need = estimate_memory_bytes(config, micro, context, precision)
    have, what = memory_limit(device, options.memory_cap_gb)
    if have is not None and not fits(need, have) and not options.skip_memory_check:
        raise ResourceError(f"this run needs about {need / 2**30:.1f} GiB but {have / 2**30:.1f} GiB are {what} on "
                            f"{device}; lower --batch-size (or use --grad-accum), close other programs, or pass "
                            "--skip-memory-check")
