"""`hitoban sft`, `hitoban tone` and their LoRA variant: options defined once (hitoban/options.py).

`tone` is `sft` with 3LM's tone-stage defaults (a few dozen steps at a lower lr, every character kept). The chat
filter's and LoRA's defaults are their own settings' (`ChatFilterSettings`, `LoraSettings`), read here, not
repeated.
"""

from __future__ import annotations

from dataclasses import dataclass

from hitoban.options import Checked, option, same_as
from hitoban.training.data.chat import ChatFilterSettings
from hitoban.training.device import DeviceOptions
from hitoban.training.finetune.lora import LoraSettings
from hitoban.training.trackers import REPORT_TO_HELP, parse_report_to

_LORA = LoraSettings()


@dataclass(kw_only=True)
class FinetuneOptions(Checked):
    """`hitoban sft`: chat fine-tuning with 3LM's SFT defaults (lr 1.5e-4, 8 epochs)."""

    stage = "sft"  # not an option: what the verb is, recorded in summary.json and lineage.json

    base: str = option(help="a from_pretrained hitoban folder (its tokenizer is reused)", positional=True)
    data: list[str] = option(help="chat files: .jsonl (messages or user/assistant), .tsv (user<TAB>assistant), .txt "
                                  "(3LM line format)", nargs="+")
    out: str = option(help="new from_pretrained folder (+ summary.json, trainer/)")
    lr: float = option(1.5e-4, "peak learning rate (cosine schedule)", above=0)
    epochs: float = option(8.0, "passes over the training chats", above=0)
    max_steps: int = option(-1, "overrides --epochs when > 0", min=-1)
    batch_size: int = option(32, "conversations per device step", min=1)
    grad_accum: int = option(1, "device steps per optimizer step", min=1)
    warmup_ratio: float = option(0.03, "share of the steps spent warming up", min=0, below=1)
    val_frac: float = option(0.01, "share of the chats held out for validation", above=0, below=1)
    eval_steps: int = option(200, "validate (and keep the best checkpoint) every N steps", min=1)
    exclude: list[str] = option(help="drop pairs matching, or sharing a 40-char window with, these held-out chats",
                                factory=list, nargs="*", metavar="HOLDOUT")
    min_char_freq: int = same_as(ChatFilterSettings, "min_char_freq")
    max_user_chars: int = same_as(ChatFilterSettings, "max_user_chars")
    max_assistant_chars: int = same_as(ChatFilterSettings, "max_assistant_chars")
    skip_bad: bool = option(False, "skip malformed lines (counted) instead of stopping")
    seed: int = option(1234, "split, shuffling and initialisation of new weights", min=0)
    lora: bool = option(False, "train a PEFT LoRA adapter instead of every weight; --out becomes the adapter folder "
                               "(AutoPeftModelForCausalLM)")
    lora_r: int = same_as(LoraSettings, "r", help="--lora: adapter rank")
    lora_alpha: int = same_as(LoraSettings, "alpha", help="--lora: scaling numerator (alpha / r)")
    lora_dropout: float = same_as(LoraSettings, "dropout", help="--lora: dropout on the adapter's input")
    lora_targets: str = option(",".join(_LORA.targets), "--lora: module names (hitoban fuses q/k/v into qkv_proj, "
                                                        "gate/up into gate_up_proj)")
    merge: bool = option(False, "--lora: write the merged model to --out and the adapter to --out/adapter")
    cpu: bool = same_as(DeviceOptions, "cpu")
    precision: str = same_as(DeviceOptions, "precision", help="auto: on CUDA the device plan's (bf16 on 8.0+, fp16 "
                             "with the Trainer's scaler on 7.x), fp32 on a CPU or Mac (fine-tuning was measured only "
                             "in fp32 there); bf16 / fp16 / no: that precision, refused where the hardware cannot "
                             "run it")
    report_to: str = option("none", REPORT_TO_HELP.replace("log.jsonl", "the Trainer's logs") + "; passed to the "
                            "Trainer as report_to, TensorBoard's events in --out/tensorboard", metavar="TRACKER,...")

    def __post_init__(self) -> None:
        super().__post_init__()
        parse_report_to(self.report_to)  # an unknown tracker is refused before anything is read

    def filters(self) -> ChatFilterSettings:
        return ChatFilterSettings(max_user_chars=self.max_user_chars, max_assistant_chars=self.max_assistant_chars,
                                  min_char_freq=self.min_char_freq)

    def lora_settings(self) -> LoraSettings | None:
        if not self.lora:
            return None
        targets = tuple(t.strip() for t in self.lora_targets.split(",") if t.strip())
        return LoraSettings(r=self.lora_r, alpha=self.lora_alpha, dropout=self.lora_dropout, targets=targets)


@dataclass(kw_only=True)
class ToneOptions(FinetuneOptions):
    """`hitoban tone`: a character's tone on a chat model, with 3LM's tone defaults (lr 1e-4, ~30 steps)."""

    stage = "tone"

    lr: float = option(1e-4, "peak learning rate (cosine schedule)", above=0)
    max_steps: int = option(30, "overrides --epochs when > 0", min=-1)
    eval_steps: int = option(10, "validate (and keep the best checkpoint) every N steps", min=1)
    min_char_freq: int = option(1, "drop chats with a character rarer than this in the data (1: keep all; a "
                                   "character's tone data is small)", min=1)


MASK_CORRUPTIONS = ("shift", "drop_end")  # sft.check_mask's negative controls


@dataclass(kw_only=True)
class CheckMaskOptions(Checked):
    """`hitoban check-mask`: the assistant-only loss mask printed and checked on fixed conversations."""

    tokenizer: str = option(help="a tokenizer (or model) folder with the chat template")
    control: str | None = option(None, "negative control: corrupt the mask on purpose; the check must then FAIL",
                                 choices=MASK_CORRUPTIONS)


@dataclass(kw_only=True)
class ChatOptions(Checked):
    """`hitoban chat`: a model in the terminal, decoded in the precision the device plan gives it."""

    model: str = option(help="a from_pretrained folder (e.g. RUN/final or an SFT output)", positional=True)
    precision: str = same_as(DeviceOptions, "precision", choices=("auto", "no", "bf16"),
                             help="auto: weights in bf16 where the hardware has it (CUDA, AMX / AVX512-BF16 CPUs), "
                                  "about twice the tokens per second on a CPU; no: fp32, as saved; bf16: refused "
                                  "where the hardware cannot run it")
