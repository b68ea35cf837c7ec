"""The optimizer component: its options (`--optimizer`, `--lr`, `--weight-decay`, `--no-adam-bias-correction`,
`--grad-clip`), the peak learning rate a run gets without `--lr` (decided here, once), and `optimizer_for`, which
makes the optimizer itself (training/optim.py: Muon + AdamW, or AdamW).

Standard library only at import (`hitoban --help` builds every parser without torch): `optimizer_for` imports the torch
optimizers when a run starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from hitoban.options import Checked, option

DEFAULT_LR = {"muon": 2e-3, "adamw": 6e-4}  # adamw: 3LM's; muon: kept for the shapes no sweep has measured
# Where a sweep measured better (README Benchmarks: small, 16 x 256, fp32 on a CPU imitating one without native bf16,
# Muon + WSD at 8e-3 beat 2e-3, 3e-3, 4e-3 and 6e-3 on both held-out domains at 114 and 240 steps; bench_night.py with
# native bf16 confirms it against the Trainer; longer nights at this shape were not swept)
PRESET_LR = {("muon", "small"): 8e-3}


def _lr_help() -> str:
    """--lr's help, written from the tables above (a default is never restated by hand)."""
    measured = ", ".join(f"{lr:g} at the {preset} preset" for (opt, preset), lr in PRESET_LR.items() if opt == "muon")
    return (f"peak learning rate (default: with muon {measured}, {DEFAULT_LR['muon']:g} at the others; "
            f"{DEFAULT_LR['adamw']:g} with adamw, 3LM's)")


def default_lr(optimizer: str, preset: str) -> float | None:
    """The peak lr a run gets without --lr: the measured one for this optimizer and shape, else the optimizer's."""
    return PRESET_LR.get((optimizer, preset), DEFAULT_LR.get(optimizer))


@dataclass(kw_only=True)
class OptimizerOptions(Checked):
    """How the weights are updated. `lr` is None until `resolve_lr` gives it the shape's default."""

    lr: float | None = option(None, _lr_help(), above=0, trajectory=True)
    weight_decay: float = option(0.1, "decoupled weight decay", min=0, trajectory=True)
    grad_clip: float = option(1.0, "clip the gradient norm (0: off)", min=0, trajectory=True)
    adam_bias_correction: bool = option(True, "AdamW without bias correction (3LM/MLX semantics: smaller first "
                                              "updates)", flag="--no-adam-bias-correction", trajectory=True)
    optimizer: str = option("muon", "muon: torch's Muon on the hidden matrices (update scaled to AdamW's RMS, same "
                                    "--lr; its Newton-Schulz in bf16 where native, else fp32), AdamW on embeddings "
                                    "and norms; adamw: AdamW on everything (3LM). Muon is the default by measurement "
                                    "(benchmarks/bench_night.py)",
                            choices=("adamw", "muon"), trajectory=True)

    def resolve_lr(self, preset: str) -> None:
        """Give `lr` its default for this shape when none was given: resolved once, so every reader (the
        fingerprint, the run folder, the card) sees the number."""
        if self.lr is None:
            self.lr = default_lr(self.optimizer, preset)

    def optimizer_for(self, model, lr: float, muon_dtype: str):
        """The optimizer over `model`'s parameters at learning rate `lr` (the schedule's first)."""
        from hitoban.training.optim import build_optimizer

        return build_optimizer(model, self.optimizer, lr, self.weight_decay, self.adam_bias_correction, muon_dtype)


__all__ = ["DEFAULT_LR", "PRESET_LR", "OptimizerOptions", "default_lr"]
