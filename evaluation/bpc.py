"""bits per character, exactly as 3LM defines it (SPEC §7, 3LM §11.1), and the cross-domain table.

ids = the whole text encoded at once; non-overlapping windows of 257 tokens at 0, 256, 512, ... (tail dropped), each
scored independently (no carried context); nats summed over the 256 predicted positions of every window;
bits/char = nats / ln 2 / (characters x scored_ratio), where characters exclude chat markers and scored_ratio =
windows x 256 / (tokens - 1). The denominator is characters, so models with different tokenizers compare fairly.
Plain PyTorch on purpose: `evaluate` is in maintenance mode and its Hub-hosted metrics fail offline.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from hitoban.errors import InputError

MARKERS = re.compile(r"<\|(?:user|assistant|end|unk)\|>")
WINDOW = 256
MIN_STABLE_WINDOWS = 8


class BpcError(InputError):
    """A domain or model that cannot be measured; the message names it."""


@torch.no_grad()
def nats_over_windows(model, ids: np.ndarray | list[int], window: int = WINDOW, batch: int = 16,
                      progress: bool = False) -> tuple[float, int]:
    """Summed next-token nats over full non-overlapping (window + 1)-token windows; returns (nats, windows)."""
    ids = np.asarray(ids, dtype=np.int64)
    count = (len(ids) - 1) // window
    rows = np.stack([ids[i * window : i * window + window + 1] for i in range(count)]) if count else None
    device = next(model.parameters()).device
    model.eval()
    total = 0.0
    for start in tqdm(range(0, count, batch), disable=not progress or None, desc="bits/char", leave=False):
        x = torch.from_numpy(rows[start : start + batch]).to(device)
        logits = model(x[:, :-1], use_cache=False).logits.float()
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum").item()
    return total, count


def bits_per_char(model, tokenizer, text: str, name: str = "text", max_chars: int | None = None,
                  window: int = WINDOW, batch: int = 16, progress: bool = False) -> dict:
    if max_chars:
        text = text[:max_chars]
    if not text.strip():
        raise BpcError(f"{name}: the text is empty")
    ids = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
    chars = len(MARKERS.sub("", text))
    nats, windows = nats_over_windows(model, ids, window, batch, progress)
    if windows == 0:
        raise BpcError(f"{name}: {len(ids)} tokens, shorter than one window of {window + 1}; give more text")
    scored_ratio = windows * window / (len(ids) - 1)
    result = {"domain": name, "bits_per_char": nats / math.log(2) / (chars * scored_ratio), "chars": chars,
              "tokens": len(ids), "windows": windows, "scored_ratio": scored_ratio, "nats": nats}
    if windows < MIN_STABLE_WINDOWS:
        result["warning"] = f"only {windows} windows ({len(ids)} tokens): too short for a stable estimate"
        warnings.warn(f"{name}: {result['warning']}", stacklevel=2)
    return result


def load_model_and_tokenizer(path: str | Path):
    """A `from_pretrained` folder with its tokenizer; a folder without one is a clear error."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hitoban  # noqa: F401  (registers the Auto classes)

    path = Path(path)
    if not (path / "config.json").exists():
        raise BpcError(f"{path}: not a model folder (no config.json)")
    if not (path / "tokenizer.json").exists():
        raise BpcError(f"{path}: no tokenizer.json; bits/char needs the model's own tokenizer next to the weights")
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def read_domain(name: str, path: str | Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise BpcError(f"domain {name}: {path} not found")
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise BpcError(f"domain {name}: {path.name} is empty")
    return text


def cross_domain(models: list[str | Path], domains: dict[str, str | Path], max_chars: int | None = 400_000,
                 progress: bool = True, shards: str | Path | None = None) -> dict:
    """bits/char for every model x domain (3LM truncates each domain to its first 400,000 chars); with `shards`,
    also every model on each source of that shard set's val split (as domains named `val:SOURCE`)."""
    texts = {name: read_domain(name, path) for name, path in domains.items()}
    records = []
    for model_path in models:
        model, tok = load_model_and_tokenizer(model_path)
        for name, text in texts.items():
            row = bits_per_char(model, tok, text, name, max_chars, progress=progress)
            records.append({"model": Path(model_path).name, **row})
        for row in shard_domain_bpc(model, tok, shards) if shards else []:
            if "bits_per_char" in row:
                records.append({"model": Path(model_path).name, **row, "domain": f"val:{row['domain']}"})
    return {"window": WINDOW, "max_chars": max_chars, "domains": {k: Path(v).name for k, v in domains.items()},
            "records": records}


def shard_domain_bpc(model, tokenizer, shards: str | Path, max_tokens: int = 200_000) -> list[dict]:
    """Per-domain bits/char on a shard set's val split (domains from `.domains.u8`)."""
    from hitoban.training.data import ShardReader

    rows = []
    for domain, stream in ShardReader(shards, "val").domain_streams(max_tokens).items():
        chars = len(tokenizer.decode(stream.tolist(), skip_special_tokens=True))
        nats, windows = nats_over_windows(model, stream)
        if windows == 0:
            rows.append({"domain": domain, "tokens": len(stream), "warning": "shorter than one window"})
            continue
        ratio = windows * WINDOW / (len(stream) - 1)
        rows.append({"domain": domain, "bits_per_char": nats / math.log(2) / (chars * ratio), "chars": chars,
                     "tokens": len(stream), "windows": windows})
    return rows


def markdown_table(result: dict) -> str:
    models = list(dict.fromkeys(r["model"] for r in result["records"]))
    domains = list(dict.fromkeys(r["domain"] for r in result["records"]))
    value = {(r["model"], r["domain"]): r for r in result["records"]}
    lines = ["| model | " + " | ".join(domains) + " |", "|---|" + "---:|" * len(domains)]
    for m in models:
        cells = [f"{value[(m, d)]['bits_per_char']:.3f}" + (" ⚠" if "warning" in value[(m, d)] else "")
                 if (m, d) in value else "—" for d in domains]  # a model not evaluated on a domain: no number
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\nbits per character (lower is better); ⚠ = too few windows for a stable value\n"


def plot_cross_domain(result: dict, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hitoban.evaluation.fonts import use_japanese_font

    use_japanese_font()
    models = list(dict.fromkeys(r["model"] for r in result["records"]))
    domains = list(dict.fromkeys(r["domain"] for r in result["records"]))
    value = {(r["model"], r["domain"]): r["bits_per_char"] for r in result["records"]}
    width = 0.8 / len(models)
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(domains) * max(1, len(models) / 2), 3.6))
    for i, m in enumerate(models):
        xs = [j + i * width for j in range(len(domains))]
        present = [(x, value[(m, d)]) for x, d in zip(xs, domains) if (m, d) in value]
        bars = ax.bar([x for x, _ in present], [v for _, v in present], width, label=m)
        ax.bar_label(bars, fmt="%.3f", fontsize=7)
    ax.set_xticks([j + width * (len(models) - 1) / 2 for j in range(len(domains))], domains)
    ax.set_ylabel("bits per character (lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(result: dict, out: str | Path) -> list[Path]:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False), encoding="utf-8")
    md, png = out.with_suffix(".md"), out.with_suffix(".png")
    md.write_text(markdown_table(result), encoding="utf-8")
    plot_cross_domain(result, png)
    return [out, md, png]
