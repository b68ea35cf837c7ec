"""The night's checkpoint policy: when to save and when to stop, one decision shared by every process.

Each rank has its own clock, signals and timers, so every decision is reduced over the ranks (any rank's yes is
everyone's) on the host, never through the device. The test hooks that plant a skewed clock or an inf loss
are training/faults.py's (`clock_skew`, `planted_inf_step`).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


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


_HOST_GROUP: list = []  # the gloo group for host-side decisions, made once per process group


def host_group():
    """A process group whose collectives run on host memory (gloo): a flag reduced over it never makes the host
    wait for the GPU. Over NCCL, whose collectives take device tensors, reading a shared flag every step would
    synchronise the host with the device's queue every step. None: the default group is gloo already."""
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
