"""LoRA fine-tunes with PEFT (`hitoban tone --lora`): a small adapter instead of a whole new model.

hitoban fuses q/k/v into one `qkv_proj` and gate/up into one `gate_up_proj`, so Llama's module names match almost
nothing here: `["q_proj", "k_proj", "v_proj", "o_proj"]` would silently adapt `o_proj` alone. Targets are checked
against the model's own module names before PEFT sees them, and the error names the right ones.
Lazy imports: peft is an optional extra (`hitoban[lora]`); it loads only with `--lora`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hitoban.errors import UsageError
from hitoban.options import CheckedSettings, option

HITOBAN_TARGETS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # every Linear in a decoder layer
LLAMA_ONLY_NAMES = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}


@dataclass
class LoraSettings(CheckedSettings):
    """A LoRA adapter's shape; the ranges are checked when made (the fine-tuning verbs copy them: `same_as`)."""

    r: int = option(16, "adapter rank", min=1)
    alpha: int = option(32, "scaling numerator (alpha / r)", min=1)
    dropout: float = option(0.05, "dropout on the adapter's input", min=0, below=1)
    targets: tuple[str, ...] = HITOBAN_TARGETS


def check_targets(model, targets: tuple[str, ...] | list[str]) -> None:
    """Refuse target names that match no module (PEFT itself only refuses when *none* match)."""
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    unmatched = [t for t in targets if t not in names]
    if unmatched:
        llama = sorted(set(unmatched) & LLAMA_ONLY_NAMES)
        hint = (f" ({', '.join(llama)}: Llama's names; hitoban fuses q/k/v into qkv_proj and gate/up into "
                "gate_up_proj)" if llama else "")
        raise UsageError(f"LoRA target module(s) {unmatched} match nothing in this model{hint}; hitoban's are "
                         f"{', '.join(HITOBAN_TARGETS)}")


def with_adapter(model, settings: LoraSettings):
    """The model wrapped by PEFT with a fresh LoRA adapter on `settings.targets` (base weights frozen)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise UsageError("--lora needs PEFT: pip install 'hitoban[lora]' (or pip install peft)") from err
    check_targets(model, settings.targets)
    config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=list(settings.targets), task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def save_adapter_and_merged(peft_model, tokenizer, out: Path, merge: bool) -> Path:
    """The adapter to `out` (loadable with `AutoPeftModelForCausalLM`), or with `merge` the merged model to `out`
    and the adapter to `out/adapter`. Returns the adapter folder."""
    adapter = out / "adapter" if merge else out
    peft_model.save_pretrained(adapter)
    tokenizer.save_pretrained(adapter)
    if merge:
        merged = peft_model.merge_and_unload()
        merged.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return adapter


__all__ = ["LoraSettings", "HITOBAN_TARGETS", "check_targets", "with_adapter", "save_adapter_and_merged"]
