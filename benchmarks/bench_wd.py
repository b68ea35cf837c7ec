"""Weight decay across run lengths: does the best `--weight-decay` stay one number, or follow the AdamW timescale
rule (the product lr x wd x steps held constant: Wang & Aitchison 2024, "How to set AdamW's weight decay as you
scale model and dataset size")?

Why it matters: the decay is coupled to the lr (each step multiplies a weight by 1 - lr x wd), so over a run it
shrinks a weight by about exp(-steps x lr x wd x the schedule's mean). With the default 0.1 at width 256 that exponent
is small over a 200-step sweep run and large over a night of tens of thousands of steps: a decay chosen on short runs
is not the decay a night gets. This benchmark measures which of the two rules the optimum follows, at one width, at
each `--steps`, in the night's regime (under one pass over the training text; the passes are printed).

Every run is `hitoban pretrain` at the `small` shape with the width replaced (bench_lr.py's runs), Muon at its lr
rule and AdamW's group at its own, and `--warmup-steps 0`: the warmup is then 2% of the steps at every length, as
in a night of more than 5,000 steps (the default's 100-step floor would be half of a 200-step run). Scored by the mean
of held-out literature and web bits/char; the optimum is the vertex of a parabola in log2(wd) through the best grid
point and its neighbours (the grid widens by 4x past an edge that wins).

    python benchmarks/bench_wd.py --width 256 --steps 200 800 --grid 0.025 0.1 0.4 1.6 --out bench-wd
    python benchmarks/bench_wd.py --width 256 --steps 800 --grid 0.1 0.4 1.6 --out bench-wd   # adds a length
    python benchmarks/bench_wd.py --width 256 --seeds 1234 7 --steps 200 --grid 0.025 0.1 0.4 1.6 --out bench-wd
    python benchmarks/bench_wd.py --width 128 --steps 200 --grid 0.1 0.4 1.6 --out bench-wd-128   # another width
    python benchmarks/bench_wd.py --from benchmarks/results/wd-steps-2026-12-06/bench_wd.json --out /tmp/wd
"""

from __future__ import annotations

import run_lengths
from run_lengths import Knob

from hitoban.training.optimizer import OptimizerOptions
from hitoban.training.schedule import ScheduleOptions

DEFAULT_WD = OptimizerOptions().weight_decay  # the product's


def mean_lr_fraction(steps: int) -> float:
    """The schedule's mean lr over the run as a fraction of its peak (the product's, with these runs' --warmup-steps
    0): the decay's exponent over a run is steps x peak lr x wd x this."""
    schedule = ScheduleOptions(warmup_steps=0).schedule_for(1.0, steps)
    return sum(schedule.lr(step) for step in range(steps)) / steps


def exponent(steps: int, lr: float, wd: float) -> float:
    """How much the decay alone shrinks a weight over the run, as the exponent of exp(-x)."""
    return steps * lr * wd * mean_lr_fraction(steps)


def report(saved: dict) -> list[str]:
    lr = saved["lr"]
    return run_lengths.report(
        saved, "Weight decay", "wd", ["wd tried: mean (literature, web)", "its decay exponent",
                                      f"the default {DEFAULT_WD:g}'s exponent"],
        lambda row: [f"{exponent(row['steps'], lr, row['optimum']):.3g}",
                     f"{exponent(row['steps'], lr, DEFAULT_WD):.3g}"],
        "the timescale rule predicts steps ^ -1, a constant wd steps ^ 0")


WEIGHT_DECAY = Knob("--weight-decay", "wd", fixed={"--warmup-steps": 0}, factor=4)


def main() -> None:
    run_lengths.main(__doc__, WEIGHT_DECAY, "bench_wd", [0.025, 0.1, 0.4, 1.6],
                     "weight decays tried at every length (widened by 4x past an edge that wins)", report)


if __name__ == "__main__":
    main()
