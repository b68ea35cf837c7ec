"""The optimizer component: its options (`--optimizer`, `--lr`, `--weight-decay`, `--no-adam-bias-correction`,
`--grad-clip`), the peak learning rate a run gets without `--lr` (decided here, once), and `optimizer_for`, which
makes the optimizer itself (training/optim.py: Muon + AdamW, or AdamW).

Standard library only at import (`hitoban --help` builds every parser without torch): `optimizer_for` imports the torch
optimizers when a run starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from hitoban.errors import UsageError
from hitoban.options import Checked, option

ADAMW_LR = 6e-4  # 3LM's, at every shape
# Muon's peak lr follows the width as a power law, fitted by benchmarks/bench_lr.py to the measured optima at four
# widths (64-384) in the night's regime, minimax in log-log: within 1.47x of each, 1.10x at the 3lm shape checked
# afterwards (docs/benchmarks.md). The exponent is close to muP's 1 for updates matched to AdamW's RMS, as Muon's are
# here (the lr that keeps a hidden layer's change steady falls as 1 / fan-in). No depth term: at width 256 the rule is
# within 1.5x of the optimum at depths 2, 4 and 8 (`bench_lr.py --depths 2 4 8`).
LR_AT_256 = 0.0127
LR_WIDTH_EXPONENT = 0.89
# Beside Muon, AdamW's group (the tied embedding and the norms' gains) has its own peak lr, fitted the same way
# (`bench_lr.py --group adamw`: three widths 64-256, two seeds a point, Muon at its rule; checked at the 3lm shape,
# docs/benchmarks.md). It falls faster with width than Muon's: the embedding is also the output layer (an update moves
# a logit through every coordinate: muP's 1 / width), and its initial std is 0.3 / sqrt(width), so one lr is a larger
# relative step in a wider model. Until this fit the group shared Muon's lr (twice this one at `small`).
ADAMW_GROUP_LR_AT_256 = 0.00577
ADAMW_GROUP_LR_WIDTH_EXPONENT = 1.89


def power_rule(at_256: float, exponent: float, width: int) -> float:
    """at_256 x (256 / width) ^ exponent, to three significant figures (the number a person reads)."""
    return float(f"{at_256 * (256 / width) ** exponent:.3g}")


def lr_for_width(width: int) -> float:
    """Muon's peak lr at this hidden size, by the rule above."""
    return power_rule(LR_AT_256, LR_WIDTH_EXPONENT, width)


def adamw_group_lr_for_width(width: int) -> float:
    """The peak lr of AdamW's group beside Muon at this hidden size, by its rule above."""
    return power_rule(ADAMW_GROUP_LR_AT_256, ADAMW_GROUP_LR_WIDTH_EXPONENT, width)


def _lr_help() -> str:
    """--lr's help, written from the rule above (a default is never restated by hand)."""
    return (f"peak learning rate: Muon's hidden matrices, or with --optimizer adamw every parameter (default: "
            f"with muon {LR_AT_256:g} x (256 / the preset's width) ^ "
            f"{LR_WIDTH_EXPONENT:g}, fitted by benchmarks/bench_lr.py, no depth term: within 1.5x of the optimum at "
            f"depths 2-8; {ADAMW_LR:g} with adamw, 3LM's)")


def _adamw_lr_help() -> str:
    return (f"with --optimizer muon, the peak learning rate of AdamW's group (embeddings and norms), on the same "
            f"schedule (default: {ADAMW_GROUP_LR_AT_256:g} x (256 / the preset's width) ^ "
            f"{ADAMW_GROUP_LR_WIDTH_EXPONENT:g}, fitted by benchmarks/bench_lr.py --group adamw)")


def default_lr(optimizer: str, width: int) -> float:
    """The peak lr a run gets without --lr: by the width rule with Muon, 3LM's with AdamW."""
    return lr_for_width(width) if optimizer == "muon" else ADAMW_LR


@dataclass(kw_only=True)
class OptimizerOptions(Checked):
    """How the weights are updated. `lr` (and with Muon `adamw_lr`) is None until `resolve_lr` gives it the shape's
    default."""

    lr: float | None = option(None, _lr_help(), above=0, trajectory=True)
    adamw_lr: float | None = option(None, _adamw_lr_help(), above=0, trajectory=True)
    weight_decay: float = option(0.1, "decoupled weight decay, one number at every width and run length (measured "
                                      "within 0.07 bits/char of the best tried at widths 128-384 and 200-800 steps: "
                                      "docs/benchmarks.md)", min=0, trajectory=True)
    grad_clip: float = option(1.0, "clip the gradient norm (0: off)", min=0, trajectory=True)
    adam_bias_correction: bool = option(True, "AdamW without bias correction (3LM/MLX semantics: smaller first "
                                              "updates)", flag="--no-adam-bias-correction", trajectory=True)
    optimizer: str = option("muon", "muon: torch's Muon on the hidden matrices (update scaled to AdamW's RMS, at "
                                    "--lr; its Newton-Schulz in bf16 where native, else fp32), AdamW on embeddings "
                                    "and norms at --adamw-lr; adamw: AdamW on everything (3LM). Muon is the "
                                    "default by measurement (benchmarks/bench_night.py)",
                            choices=("adamw", "muon"), trajectory=True)

    def __post_init__(self) -> None:
        super().__post_init__()  # the ranges
        if self.optimizer == "adamw" and self.adamw_lr is not None:  # a group only Muon's runs have
            raise UsageError("--adamw-lr sets AdamW's group beside Muon; with --optimizer adamw every parameter "
                             "follows --lr: drop --adamw-lr")

    @property
    def needs_width(self) -> bool:
        """Whether a default rate is still to come from the model's width (`resolve_lr`)."""
        return self.lr is None or (self.adamw_lr is None and self.optimizer == "muon")

    def resolve_lr(self, width: int) -> None:
        """Give `lr` its default for a model of this hidden size when none was given: resolved once, so every reader
        (the fingerprint, the run folder, the card) sees the number."""
        if self.lr is None:
            self.lr = default_lr(self.optimizer, width)
        if self.adamw_lr is None and self.optimizer == "muon":
            self.adamw_lr = adamw_group_lr_for_width(width)

    def optimizer_for(self, model, lr: float, muon_dtype: str):
        """The optimizer over `model`'s parameters at learning rate `lr` (the schedule's first); AdamW's group beside
        Muon runs at `adamw_lr / self.lr` of it at every step (its `lr_scale`)."""
        from hitoban.training.optim import build_optimizer

        ratio = self.adamw_lr / self.lr if self.optimizer == "muon" and self.adamw_lr is not None else 1.0
        return build_optimizer(model, self.optimizer, lr, self.weight_decay, self.adam_bias_correction, muon_dtype,
                               adamw_ratio=ratio)


__all__ = ["ADAMW_GROUP_LR_AT_256", "ADAMW_GROUP_LR_WIDTH_EXPONENT", "ADAMW_LR", "LR_AT_256", "LR_WIDTH_EXPONENT",
           "OptimizerOptions", "adamw_group_lr_for_width", "default_lr", "lr_for_width", "power_rule"]
