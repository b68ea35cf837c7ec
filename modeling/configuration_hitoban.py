"""HitobanConfig: the shape of a hitoban decoder (Llama-compatible, tied embeddings, no biases).

Self-contained on purpose (transformers single-model-file policy): this file ships unchanged as remote code
next to published weights, so it imports nothing from hitoban.
"""

from __future__ import annotations

import math
from typing import ClassVar

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

# Named shapes. `3lm` is the 35.66M model of the 3LM reference (35,658,240 parameters at vocab 32000);
# `zxell-s` is zxell's 29.1M RTX-3060 model; `tiny` is for tests and the demo.
PRESETS: dict[str, dict] = {
    "tiny": dict(vocab_size=4096, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=256),
    "small": dict(vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                  max_position_embeddings=256),
    "3lm": dict(vocab_size=32000, hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                max_position_embeddings=512),
    "zxell-s": dict(vocab_size=48000, hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
                    max_position_embeddings=1024),
}


def swiglu_width(hidden_size: int) -> int:
    """3LM's SwiGLU width: 8/3 of the hidden size, rounded to a multiple of 128 (512 -> 1408)."""
    return max(128, round(hidden_size * 8 / 3 / 128) * 128)


@strict
class HitobanConfig(PreTrainedConfig):
    """Configuration of `HitobanForCausalLM`.

    `initializer_range` is the std of the token embedding at init. Left unset it becomes 0.3/sqrt(hidden_size),
    which keeps the tied-output logits' variance at 0.09 so the first loss on random tokens is ln(vocab) + ~0.05.
    3LM's MLX default (std 1/sqrt(hidden_size)) gives unit-variance logits and ln(vocab) + ~0.5; pass
    `initializer_range=hidden_size ** -0.5` to reproduce it. Linear layers are always U(+-1/sqrt(fan_in)).
    """

    model_type: ClassVar[str] = "hitoban"
    keys_to_ignore_at_inference: ClassVar[list[str]] = ["cache"]

    vocab_size: int = 32000
    hidden_size: int = 512
    num_hidden_layers: int = 6
    num_attention_heads: int = 8
    intermediate_size: int | None = None
    max_position_embeddings: int = 512
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    initializer_range: float | None = None
    dropout: float = 0.0
    tie_word_embeddings: bool = True
    use_cache: bool = True
    unk_token_id: int | None = 0
    pad_token_id: int | None = 3
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = 3

    def __post_init__(self, **kwargs):
        if self.intermediate_size is None:
            self.intermediate_size = swiglu_width(self.hidden_size)
        if self.initializer_range is None:
            self.initializer_range = round(0.3 / math.sqrt(self.hidden_size), 8)
        # The attention code and the KV cache read these two; they are derived, never set by hand.
        self.num_key_value_heads = self.num_attention_heads
        self.head_dim = self.hidden_size // self.num_attention_heads
        super().__post_init__(**kwargs)

    def validate_architecture(self):
        """Cross-field checks run by `@strict` (bad shapes fail at construction, not deep inside forward)."""
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError("head dim must be even: RoPE rotates pairs (i, i + head_dim/2)")

    @classmethod
    def from_preset(cls, name: str, **overrides) -> HitobanConfig:
        """A named shape (`tiny`, `small`, `3lm`, `zxell-s`) with any field overridden, e.g. `vocab_size`."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})


__all__ = ["HitobanConfig", "PRESETS", "swiglu_width"]
