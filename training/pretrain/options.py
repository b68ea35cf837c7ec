"""`hitoban pretrain`'s options, defined once (hitoban/options.py): the trajectory (what the kill test must
run exactly) and the run's budget, folder and bookkeeping. `hitoban killtest`, `calibrate` and `--supervise` take
theirs from here too. Standard library only at import: `hitoban --help` builds every parser without torch.
Lazy imports: the model presets (torch) load only when a shape is resolved."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hitoban.options import Checked, option, parse_count, same_as
from hitoban.training.device import DeviceOptions
from hitoban.training.optimizer import OptimizerOptions
from hitoban.training.schedule import ScheduleOptions
from hitoban.training.trackers import REPORT_TO_HELP, parse_report_to


@dataclass(kw_only=True)
class TrainingOptions(OptimizerOptions, ScheduleOptions, DeviceOptions):
    """What shapes a training trajectory: the kill test must run the night with exactly these. Composed of the
    components' own options (the optimizer's, the schedule's, the device's), plus the data and the model's shape;
    the fields a resume must keep say so (`trajectory=True`, read by `trajectory_fields`)."""

    data: str = option(help="a shard folder from `hitoban shards`")
    preset: str = option("3lm", "model shape", choices=("tiny", "small", "3lm", "zxell-s"))
    batch_size: int = option(32, "sequences per optimizer step, over all processes (3LM's 32; at a fixed token "
                                 "budget, measured: in runs of a few hundred steps 16 trains better, by 0.15 bits/char "
                                 "at 0.8M tokens; at 3.3M tokens 32 was best, 16 and 64 within 0.03 (width 256; at "
                                 "0.8M tokens 16 was best at widths 128 and 384 and at the 3lm shape too): "
                                 "docs/benchmarks.md)", min=1,
                             trajectory=True)
    context: int | None = option(None, "tokens per sequence (default: the preset's)", min=2, trajectory=True)
    grad_accum: int = option(1, "micro-batches per step (same result, less memory)", min=1, trajectory=True,
                             machine=True)
    dropout: float = option(0.0, "residual and embedding dropout", min=0, below=1, trajectory=True)
    seed: int = option(1234, "initialisation and batches: (seed, step) -> batch", min=0, trajectory=True)

    def __post_init__(self) -> None:
        super().__post_init__()  # the ranges, and the optimizer component's own check
        if self.needs_width:
            from hitoban.modeling.configuration_hitoban import PRESETS  # lazy: the model package loads torch

            if self.preset in PRESETS:  # an unknown one is refused by name where the run starts
                self.resolve_lr(PRESETS[self.preset]["hidden_size"])


def trajectory_fields(cls: type = TrainingOptions) -> tuple[str, ...]:
    """The options a resumed run must share with its checkpoint (declared `trajectory=True` on the fields)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("trajectory"))


@dataclass(kw_only=True)
class PretrainConfig(TrainingOptions):
    """`hitoban pretrain`: the trajectory plus the run's budget, folder and bookkeeping."""

    out: str = option(help="run folder: checkpoints, final/, log.jsonl, heartbeat.json")
    tokens: int | None = option(None, "token budget (the LR schedule is built for exactly this)", group="budget",
                                parse=parse_count, min=1)
    steps: int | None = option(None, "step budget", group="budget", min=1)
    hours: float | None = option(None, "size the budget to end this many hours after the night starts (its setup "
                                       "and the measurement count): tok/s measured on this run's shape and device, "
                                       "then fixed for the run (a resume keeps it)", group="budget",
                                 above=0)
    resume: str = option("auto", "auto: continue from the last complete checkpoint; never: start over in --out",
                         choices=("auto", "never"))
    allow_change: str | None = option(None, "resume even though these options differ from the checkpoint's (e.g. "
                                            "lr,total_steps); the change is recorded in log.jsonl",
                                      metavar="OPTION,...")
    save_every_steps: int | None = option(None, "also save every N steps", min=1)
    save_every_min: float = option(10.0, "save at least this often (minutes)", above=0)
    eval_every: int = option(500, "validation every N steps (and at the end)", min=1)
    eval_batches: int = option(20, "fixed validation batches per evaluation", min=1)
    log_every: int = option(50, "a train record in log.jsonl every N steps; also where the loss is read from the "
                                "device and checked for NaN", min=1)
    max_hours: float | None = option(None, "save and stop cleanly after this much training time", above=0)
    progress: bool = option(True, "progress bar (log.jsonl and heartbeat.json are written either way)",
                            flag="--no-progress")
    report_to: str = option("none", REPORT_TO_HELP, metavar="TRACKER,...")

    def __post_init__(self) -> None:
        super().__post_init__()
        parse_report_to(self.report_to)  # an unknown tracker is refused before anything is read


@dataclass(kw_only=True)
class SuperviseOptions(Checked):
    """`hitoban pretrain --supervise`: the night relaunched by a parent process after a crash."""

    supervise: bool = option(False, "relaunch after a crash while the saved step advances; keep the machine awake")
    max_restarts: int = option(40, "--supervise: give up after this many relaunches", min=0)


@dataclass(kw_only=True)
class KillTestOptions(TrainingOptions):
    """`hitoban killtest`: the night's trajectory options, run short, killed and resumed."""

    work: str = option("hitoban-killtest", "scratch folder; killtest.json and .png land here")
    steps: int = option(60, "length of each run (the night's other options are kept)", min=1)
    kills: int = option(2, "SIGKILLs (the first lands inside a checkpoint save)", min=1)
    eval_every: int | None = option(None, "validation every N steps (default: at the end only)", min=1)


CANDIDATES = ("tiny:8", "small:16", "3lm:24", "3lm:32", "3lm:48", "zxell-s:16")


@dataclass(kw_only=True)
class CalibrateOptions(Checked):
    """`hitoban calibrate`: the candidates measured, and the device choices the night itself would make."""

    data: str | None = option(None, "a shard folder from `hitoban shards` (default: random tokens of --vocab-size)")
    context: int | None = same_as(TrainingOptions, "context")
    optimizer: str = same_as(TrainingOptions, "optimizer")
    precision: str = same_as(TrainingOptions, "precision")
    compile: str = same_as(TrainingOptions, "compile", help="measure the compiled step where the night's --compile "
                           "would compile (auto: the night's own choice for a run of --hours on this machine); the "
                           "compile time is excluded, as --hours does")
    cpu: bool = same_as(TrainingOptions, "cpu")
    memory_cap_gb: float | None = same_as(TrainingOptions, "memory_cap_gb", help="measure only the candidates whose "
                                          "estimated memory fits in this much (GiB) as well as in what is free")
    hours: float = option(8.0, "length of the night", above=0)
    candidate: list[str] = option(help="PRESET:BATCH to measure; repeatable (default: " + " ".join(CANDIDATES) + ")",
                                  factory=lambda: list(CANDIDATES), repeat=True, metavar="PRESET:BATCH")
    vocab_size: int = option(32000, "vocabulary without --data (with it: the shards')", min=260, max=65536)
    steps: int = option(10, "timed steps per candidate at least (after --warmup); more, up to --max-seconds, until "
                            "the timings settle within 10%%", min=1)
    warmup: int = option(3, "untimed steps first (allocation, kernel selection)", min=0)
    max_seconds: float = option(60.0, "timing per candidate at most: past it the steps timed so far stand, and a "
                                      "spread still over 10%% is reported as unsettled", above=0)
    out: str | None = option(None, "also write the table as JSON")


def shaped_config(preset: str, vocab_size: int, context: int | None = None, **overrides) -> tuple:
    """(the preset's model config for this vocabulary with room for `context` positions, the context; default: the
    preset's). The model is imported here, not above: `hitoban --help` reads these options without torch."""
    from hitoban.modeling import HitobanConfig

    config = HitobanConfig.from_preset(preset, vocab_size=vocab_size, **overrides)
    context = context or config.max_position_embeddings
    config.max_position_embeddings = max(config.max_position_embeddings, context)
    return config, context


@dataclass(kw_only=True)
class WatchOptions(Checked):
    """`hitoban watch`: a run's progress from its heartbeat, refreshed."""

    run: str = option(help="a pretraining run folder", positional=True)
    interval: float = option(10.0, "seconds between refreshes", above=0)
    once: bool = option(False, "print once and exit")
