"""KV-cache check: cached step-by-step decoding must equal full recomputation (docs/design.md §12).

A wrong cache offset (RoPE rotating new tokens at position 0) or a cache that drops or duplicates entries still
produces fluent-looking text, so it is checked numerically: for every decoding step, the last-position logits from
the cached path are compared with a fresh full forward over the whole sequence. `break_rope_offset=True` feeds the
new token at position 0 instead of its true position; the check must then fail (negative control).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import DynamicCache

from hitoban.evaluation.options import KVCACHE_ATOL, KVCACHE_STEPS, KvcacheOptions
from hitoban.modeling import HitobanConfig, HitobanForCausalLM
from hitoban.modeling.loading import check_model_folder, device_for
from hitoban.options import checked_against

KVCACHE_CONFIG = dict(vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                      max_position_embeddings=64)


@checked_against(KvcacheOptions, "steps", "atol")
@torch.no_grad()
def check_kvcache(
    model: HitobanForCausalLM | str | Path | None = None,
    prompt_len: int = 5,
    steps: int = KVCACHE_STEPS,
    seed: int = 1234,
    atol: float = KVCACHE_ATOL,
    break_rope_offset: bool = False,
    device=None,
) -> dict:
    """Greedy-decode `steps` tokens with the cache and compare each step's logits with a full forward. `model`: a
    model, a from_pretrained folder (on `device`, default the best there is), or None for a random tiny model."""
    if isinstance(model, (str, Path)):
        folder = check_model_folder(model, tokenizer=False)
        model = HitobanForCausalLM.from_pretrained(folder).to(device or device_for())
    torch.manual_seed(seed)
    model = (model or HitobanForCausalLM(HitobanConfig(**KVCACHE_CONFIG))).float().eval()
    ids = torch.randint(0, model.config.vocab_size, (1, prompt_len)).to(model.device)
    cache = DynamicCache(config=model.config)
    logits = model(ids, cache=cache, use_cache=True).logits[:, -1]
    diffs = []
    for _ in range(steps):
        full = model(ids, use_cache=False).logits[:, -1]
        diffs.append((logits - full).abs().max().item())
        next_id = full.argmax(-1, keepdim=True)
        ids = torch.cat([ids, next_id], dim=1)
        position = torch.zeros_like(next_id) if break_rope_offset else None
        logits = model(next_id, cache=cache, use_cache=True, position_ids=position).logits[:, -1]
    diffs.append((logits - model(ids, use_cache=False).logits[:, -1]).abs().max().item())
    worst = max(diffs)
    return {"max_abs_diff": worst, "mean_abs_diff": sum(diffs) / len(diffs), "steps": steps, "atol": atol,
            "positions_checked": len(diffs), "broken_rope_offset": break_rope_offset, "passed": worst <= atol}
