"""`hitoban compare`: the same prompts with the same per-prompt seeds through several models (docs/design.md §12).

Modes: chat (chat template, stops at <|end|>/<|user|>) and raw continuation (no markers, no stop). Seed before
prompt j of group g = seed + 100 g + j, so every model samples with the same seed per prompt. Full replies go into
the JSON so a figure can always be audited; the PNG lays models side by side with no hand-typed numbers.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

from hitoban.evaluation.fonts import use_japanese_font
from hitoban.evaluation.generation import SAMPLING, reply, sampling_processors
from hitoban.evaluation.options import COMPARE_NEW_TOKENS, COMPARE_SEED, CompareOptions
from hitoban.modeling.loading import load_model_and_tokenizer
from hitoban.options import checked_against
from hitoban.provenance import write_json

CHAT_PROMPTS = ["おすすめの本を3つ挙げてください", "短く自己紹介してください", "日本の首都はどこですか", "疲れました"]
RAW_PROMPTS = ["梅雨が明けると、庭の紫陽花は", "この製品の保証期間は購入日から", "駅前の再開発について、市は"]


@torch.no_grad()
def continue_text(model, tokenizer, prompt: str, settings: dict) -> str:
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"].to(model.device)
    processors, flags = sampling_processors(ids.shape[1], settings)
    length = settings["max_new_tokens"]  # raw mode has no stop: always the full length
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=length, min_new_tokens=length,
                         logits_processor=processors, pad_token_id=tokenizer.pad_token_id, **flags)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


@checked_against(CompareOptions, "max_new_tokens", "seed")
def compare_models(models: list[str | Path], chat: list[str] | None = None, raw: list[str] | None = None,
                   max_new_tokens: int = COMPARE_NEW_TOKENS, seed: int = COMPARE_SEED,
                   device=None) -> dict:
    settings = {**SAMPLING, "max_new_tokens": max_new_tokens, "seed": seed}
    groups = [("chat", chat if chat is not None else CHAT_PROMPTS), ("raw", raw if raw is not None else RAW_PROMPTS)]
    records = []
    for model_path in models:
        model, tok = load_model_and_tokenizer(model_path, device)
        for g, (mode, prompts) in enumerate(groups):
            for j, prompt in enumerate(prompts):
                torch.manual_seed(seed + 100 * g + j)
                if mode == "chat":
                    text, _ = reply(model, tok, [{"role": "user", "content": prompt}], settings)
                else:
                    text = continue_text(model, tok, prompt, settings)
                records.append({"mode": mode, "model": Path(model_path).name, "prompt": prompt, "reply": text})
    return {"kind": "comparison", "schema": 1, "sampling": settings, "records": records}


def plot_comparison(result: dict, path: str | Path, chars_per_line: int = 22, max_chars: int = 160) -> None:
    import matplotlib  # lazy: the Agg backend is chosen before pyplot loads; no figure, no matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after matplotlib.use("Agg")

    use_japanese_font()
    models = list(dict.fromkeys(r["model"] for r in result["records"]))
    prompts = list(dict.fromkeys((r["mode"], r["prompt"]) for r in result["records"]))
    text = {(r["model"], r["mode"], r["prompt"]): r["reply"] for r in result["records"]}
    fig, axes = plt.subplots(len(prompts), len(models), figsize=(3.6 * len(models), 1.9 * len(prompts)),
                             squeeze=False)
    for i, (mode, prompt) in enumerate(prompts):
        for j, model in enumerate(models):
            ax = axes[i][j]
            ax.axis("off")
            body = text[(model, mode, prompt)]
            body = body[:max_chars] + ("…" if len(body) > max_chars else "")
            wrapped = "\n".join(textwrap.wrap(body, chars_per_line) or [""])
            ax.set_title(f"{model} · {mode}: {prompt}", fontsize=7, loc="left")
            ax.text(0, 1, wrapped, va="top", fontsize=7, family=matplotlib.rcParams["font.family"])
    s = result["sampling"]
    fig.text(0.01, 0.005, f"T {s['temperature']} · top-k {s['top_k']} · penalty {s['repetition_penalty']} "
             f"(last {s['penalty_window']} generated) · {s['max_new_tokens']} tokens · seed {s['seed']}+100g+j",
             fontsize=6)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_comparison(result: dict, out_dir: str | Path) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "compare.json", result)
    plot_comparison(result, out_dir / "compare.png")
    return [out_dir / "compare.json", out_dir / "compare.png"]
