"""The options of a training run, defined once: a dataclass field per option, its help and its default.

`hitoban pretrain`, `hitoban killtest` and `hitoban calibrate` build their command lines from these dataclasses (as
`transformers.HfArgumentParser` does, but into the subcommand parsers the CLI already has), so an option or a
default is never written twice and the kill test can hand the night's exact options to its runs (`to_argv`).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field


def option(default=dataclasses.MISSING, help: str = "", **meta):  # noqa: A002 - argparse's own word
    """A dataclass field with its command-line help. meta: choices, group (a mutually exclusive group that must be
    given), flag (the spelling of a boolean switch), parse (a callable for the value), metavar."""
    return field(default=default, metadata={"help": help, **meta})


def _parse_count(text: str) -> int:
    return int(float(text))  # 1e9 and 1_000_000 both work for token budgets


@dataclass(kw_only=True)
class TrainingOptions:
    """What shapes a training trajectory: the kill test must run the night with exactly these."""

    data: str = option(help="a shard folder from `hitoban shards`")
    preset: str = option("3lm", "model shape", choices=("tiny", "small", "3lm", "zxell-s"))
    batch_size: int = option(32, "sequences per optimizer step, over all processes")
    context: int | None = option(None, "tokens per sequence (default: the preset's)")
    grad_accum: int = option(1, "micro-batches per step (same result, less memory)")
    lr: float | None = option(None, "peak learning rate (default: 2e-3 with muon, 3LM's 6e-4 with adamw)")
    min_lr_ratio: float = option(0.1, "the schedule ends at this fraction of the peak")
    warmup_frac: float = option(0.02, "warmup: max(100 steps, this fraction), from 2%% of the peak")
    weight_decay: float = option(0.1, "decoupled weight decay")
    grad_clip: float = option(1.0, "clip the gradient norm (0: off)")
    adam_bias_correction: bool = option(True, "AdamW without bias correction (3LM/MLX semantics: smaller first "
                                              "updates)", flag="--no-adam-bias-correction")
    optimizer: str = option("muon", "muon: torch's Muon on the hidden matrices (update scaled to AdamW's RMS, same "
                                    "--lr; its Newton-Schulz in bf16 where native, else fp32), AdamW on embeddings "
                                    "and norms; adamw: AdamW on everything (3LM). Muon is the default by measurement "
                                    "(benchmarks/bench_night.py)",
                            choices=("adamw", "muon"))
    schedule: str = option("wsd", "wsd: warmup-stable-decay with a linear warmdown over --decay-frac (extendable); "
                                  "cosine: to --min-lr-ratio (3LM)", choices=("cosine", "wsd"))
    decay_frac: float = option(0.2, "wsd: the warmdown's share of the steps")
    dropout: float = option(0.0, "residual and embedding dropout")
    seed: int = option(1234, "initialisation and batches: (seed, step) -> batch")
    precision: str = option("auto", "auto: the device plan (training/hardware.py): bf16 where the hardware has it "
                                    "(CUDA 8.0+, CPUs with AMX / AVX512-BF16), fp16 on CUDA 7.x (T4, V100), fp32 "
                                    "elsewhere, MPS included (bf16 there needs macOS 14; fp16 needs a GPU)",
                            choices=("auto", "no", "bf16", "fp16"))
    compile: str = option("auto", "torch.compile the model. auto: on CUDA 7.0+; on a CPU only when a measurement on "
                                  "this machine says the run is long enough to repay the compile time (cached)",
                          choices=("auto", "on", "off"))
    cpu: bool = option(False, "train on the CPU even when a GPU/MPS is present")
    memory_cap_gb: float | None = option(None, "cap GPU/MPS memory for this process (GiB)")
    skip_memory_check: bool = option(False, "start even when the memory estimate exceeds what is free")


@dataclass(kw_only=True)
class PretrainConfig(TrainingOptions):
    """`hitoban pretrain`: the trajectory plus the run's budget, folder and bookkeeping."""

    out: str = option(help="run folder: checkpoints, final/, log.jsonl, heartbeat.json")
    tokens: int | None = option(None, "token budget (the LR schedule is built for exactly this)", group="budget",
                                parse=_parse_count)
    steps: int | None = option(None, "step budget", group="budget")
    hours: float | None = option(None, "size the budget to end in this many hours: tok/s measured on this run's "
                                       "shape and device, then fixed for the run (a resume keeps it)", group="budget")
    resume: str = option("auto", "auto: continue from the last complete checkpoint; never: start over in --out",
                         choices=("auto", "never"))
    allow_change: str | None = option(None, "resume even though these options differ from the checkpoint's (e.g. "
                                            "lr,total_steps); the change is recorded in log.jsonl",
                                      metavar="OPTION,...")
    save_every_steps: int | None = option(None, "also save every N steps")
    save_every_min: float = option(10.0, "save at least this often (minutes)")
    eval_every: int = option(500, "validation every N steps (and at the end)")
    eval_batches: int = option(20, "fixed validation batches per evaluation")
    log_every: int = option(50, "a train record in log.jsonl every N steps; also where the loss is read from the "
                                "device and checked for NaN")
    max_hours: float | None = option(None, "save and stop cleanly after this much training time")
    progress: bool = option(True, "progress bar (log.jsonl and heartbeat.json are written either way)",
                            flag="--no-progress")


DEFAULT_LR = {"muon": 2e-3, "adamw": 6e-4}  # measured at the small shape (README, Benchmarks); adamw: 3LM's


def with_default_lr(options: TrainingOptions) -> TrainingOptions:
    """The options with --lr resolved for their optimizer (the checkpoint records the number, not the default)."""
    return options if options.lr is not None else dataclasses.replace(options, lr=DEFAULT_LR[options.optimizer])


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_options(parser: argparse.ArgumentParser, cls: type, only: tuple[str, ...] | None = None,
                skip: tuple[str, ...] = (), optional: tuple[str, ...] = ()) -> None:
    """Add `cls`'s fields (or `only` those, minus `skip`) as options; fields without a default are required unless
    named in `optional`. Every help ends with the default (the CLI's formatter shows it)."""
    hints = typing.get_type_hints(cls)
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for f in dataclasses.fields(cls):
        if (only is not None and f.name not in only) or f.name in skip:
            continue
        kind = hints[f.name]
        base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
        meta, kwargs = f.metadata, {"help": f.metadata.get("help", ""), "dest": f.name}
        if base is bool:
            kwargs.update(action="store_false" if f.default else "store_true", default=f.default)
        else:
            kwargs.update(type=meta.get("parse", base), metavar=meta.get("metavar"))
            if meta.get("choices"):
                kwargs["choices"] = meta["choices"]
            if f.default is dataclasses.MISSING:
                kwargs["required"] = f.name not in optional and "group" not in meta
                kwargs["default"] = None
            else:
                kwargs["default"] = f.default
        target = parser
        if meta.get("group"):
            if meta["group"] not in groups:
                groups[meta["group"]] = parser.add_mutually_exclusive_group(required=True)
            target = groups[meta["group"]]
        target.add_argument(_flag(f), **{k: v for k, v in kwargs.items() if v is not None or k == "default"})


def from_args(cls: type, args: argparse.Namespace, **overrides):
    """The dataclass of parsed `args` (fields the parser did not define keep their defaults)."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {name: getattr(args, name) for name in names if hasattr(args, name)}
    return cls(**{**values, **overrides})


def to_argv(options: TrainingOptions, skip: tuple[str, ...] = ("data",)) -> list[str]:
    """The trajectory options of `options` as command-line arguments again (the kill test's runs), defaults
    included, so a changed default can never make the kill test run another night than the one it vouches for."""
    argv: list[str] = []
    for f in dataclasses.fields(TrainingOptions):
        value = getattr(options, f.name)
        if f.name in skip or value is None:
            continue
        if isinstance(value, bool):
            if value != f.default:
                argv.append(_flag(f))
        else:
            argv += [_flag(f), str(value)]
    return argv


__all__ = ["TrainingOptions", "PretrainConfig", "add_options", "from_args", "to_argv", "option", "with_default_lr",
           "DEFAULT_LR"]
