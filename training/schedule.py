"""The learning-rate schedule, one small value built once for exactly the run's budget (docs/design.md §6).

Linear warmup over max(100 steps, 2%) from 2% of the peak (`--warmup-steps`, `--warmup-frac`: a short run can lower
the floor), then either cosine to 10% of the peak at the last step (3LM) or warmup-stable-decay. (3LM's predecessor
stopped on a time cap before its cosine had decayed; a schedule sized to the real budget cannot.) The LR is a pure
function of the step, like the batches, so a resume needs only the step to continue it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hitoban.options import Checked, option


@dataclass(frozen=True)
class Schedule:
    """cosine: warmup, then cosine to `min_ratio` of the peak at the last step (3LM).
    wsd (warmup-stable-decay): warmup, the peak held, then a linear warmdown to `min_ratio` over the last
    `decay_frac` of the steps. Everything before the warmdown is independent of the budget, so a night can be
    extended (`--allow-change total_steps`) from a checkpoint taken before its warmdown without changing the past."""

    peak: float
    total_steps: int
    kind: str = "cosine"
    warmup_frac: float = 0.02
    min_ratio: float = 0.1
    decay_frac: float = 0.2
    warmup_steps: int = 100  # the warmup lasts at least this many steps (the option of the same name)

    @property
    def warmup(self) -> int:
        return min(max(self.warmup_steps, int(self.total_steps * self.warmup_frac)), max(1, self.total_steps - 1))

    def lr(self, step: int) -> float:
        """LR for the update made after `step` updates (3LM: update k uses lr(k - 1))."""
        peak, warmup, floor = self.peak, self.warmup, self.peak * self.min_ratio
        if step < warmup:
            return peak * 0.02 + (peak - peak * 0.02) * step / warmup
        if self.kind == "wsd":
            start = max(warmup, self.total_steps - max(1, round(self.total_steps * self.decay_frac)))
            if step < start:
                return peak
            span = max(1, self.total_steps - start)
            return peak + (floor - peak) * min(step - start, self.total_steps - start) / span
        span = max(1, self.total_steps - warmup)
        progress = min(step - warmup, span) / span
        return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass(kw_only=True)
class ScheduleOptions(Checked):
    """The schedule component's options; `schedule_for` sizes the schedule to a run's peak and budget."""

    min_lr_ratio: float = option(0.1, "the schedule ends at this fraction of the peak", min=0, max=1, trajectory=True)
    warmup_frac: float = option(0.02, "warmup: max(--warmup-steps, this fraction of the steps), from 2%% of the peak "
                                      "(measured in 200-step runs: 2%% is within 0.03 bits/char of the best warmup "
                                      "tried at widths 128, 256 and 384, and the better of 2%% and 16 steps at the 3lm "
                                      "shape: docs/benchmarks.md)",
                                min=0, max=1, trajectory=True)
    warmup_steps: int = option(100, "the warmup lasts at least this many steps (--warmup-frac can lengthen it, not "
                                    "shorten it: 0 leaves the fraction alone)", min=0, trajectory=True)
    schedule: str = option("wsd", "wsd: warmup-stable-decay with a linear warmdown over --decay-frac (extendable); "
                                  "cosine: to --min-lr-ratio (3LM)", choices=("cosine", "wsd"), trajectory=True)
    decay_frac: float = option(0.2, "wsd: the warmdown's share of the steps", min=0, max=1, trajectory=True)

    def schedule_for(self, peak: float, total_steps: int) -> Schedule:
        """The schedule of a run of `total_steps` peaking at `peak`."""
        return Schedule(peak, total_steps, self.schedule, self.warmup_frac, self.min_lr_ratio, self.decay_frac,
                        warmup_steps=self.warmup_steps)
