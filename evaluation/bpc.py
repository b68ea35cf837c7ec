"""bits per character, with every character of the text scored exactly once (docs/design.md §11), and the
cross-domain table.

3LM's definition is kept where it is exact: the whole text encoded at once, windows of 256 predicted tokens, each
scored independently (no carried context), nats summed, / ln 2 / characters, so models with different tokenizers
compare fairly. Two of its estimates are replaced by exact counts:
- coverage: 3LM dropped the tail window and scaled the character count by windows·256/(tokens−1). Here the first
  token is predicted from the document separator (`<|end|>`, what precedes every document in pretraining) and the
  last, shorter window is scored too, so every token is predicted exactly once and the denominator is the true
  character count. The tokenizer's offsets must cover every character (checked, not assumed).
- chat markers (`<|user|>`, `<|assistant|>`, `<|end|>`, `<|unk|>`) count on **neither** side: their tokens' nats
  are left out of the numerator as their characters are left out of the denominator (3LM scored the tokens but
  did not count the characters).
Plain PyTorch on purpose: `evaluate` is in maintenance mode and its Hub-hosted metrics fail offline.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np

from hitoban.errors import InputError
from hitoban.evaluation.fonts import use_japanese_font
from hitoban.evaluation.options import DOMAIN_CHARS, EvalOptions
from hitoban.files import read_text
from hitoban.modeling.loading import load_model_and_tokenizer
from hitoban.options import checked_against
from hitoban.provenance import sha256_file, weights_sha256, write_json
from hitoban.training.data.reader import ShardReader
from hitoban.training.data.shards import load_index, tokenizer_sha256
from hitoban.training.data.tokenizer import MARKERS
from hitoban.training.nll import token_nats

WINDOW = 256
MIN_STABLE_WINDOWS = 8
MARKER_RULE = "chat markers excluded from both the nats and the characters"


class BpcError(InputError):
    """A domain or model that cannot be measured; the message names it."""


def context_token(tokenizer) -> int:
    """The token that precedes the first one: the document separator the model saw before every document."""
    for candidate in (tokenizer.eos_token_id, tokenizer.bos_token_id):
        if candidate is not None:
            return int(candidate)
    raise BpcError("the tokenizer has neither an eos nor a bos token to predict the first token from")


def _record(name: str, nats: np.ndarray, marker_tokens: np.ndarray, chars: int, window: int) -> dict:
    scored = ~marker_tokens
    total = float(nats[scored].sum())
    result = {"domain": name, "bits_per_char": total / math.log(2) / chars, "chars": chars, "tokens": len(nats),
              "scored_tokens": int(scored.sum()), "marker_tokens": int(marker_tokens.sum()),
              "windows": -(-len(nats) // window), "nats": total, "markers": MARKER_RULE}
    if len(nats) < MIN_STABLE_WINDOWS * window:
        result["warning"] = (f"only {len(nats)} tokens (< {MIN_STABLE_WINDOWS} windows of {window}): too short for "
                             "a stable estimate")
        warnings.warn(f"{name}: {result['warning']}", stacklevel=3)
    return result


def bits_per_char(model, tokenizer, text: str, name: str = "text", max_chars: int | None = None,
                  window: int = WINDOW, batch: int = 16, progress: bool = False) -> dict:
    if max_chars:
        text = text[:max_chars]
    if not text.strip():
        raise BpcError(f"{name}: the text is empty")
    encoding = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
    in_marker = np.zeros(len(text), dtype=bool)
    for m in MARKERS.finditer(text):
        in_marker[m.start():m.end()] = True
    covered = np.zeros(len(text), dtype=bool)
    marker_tokens = np.zeros(len(encoding.ids), dtype=bool)
    for i, (start, end) in enumerate(encoding.offsets):
        covered[start:end] = True
        marker_tokens[i] = end > start and bool(in_marker[start:end].all())
    if not covered.all():
        raise BpcError(f"{name}: the tokenizer's offsets leave {int((~covered).sum())} characters uncovered (a "
                       "normaliser that drops characters?); bits/char would not be per character")
    chars = int((~in_marker).sum())
    if chars == 0:
        raise BpcError(f"{name}: the text holds only chat markers")
    nats = token_nats(model, encoding.ids, context_token(tokenizer), window, batch, progress)
    return _record(name, nats, marker_tokens, chars, window)


def read_domain(name: str, path: str | Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise BpcError(f"domain {name}: {path} not found")
    text = read_text(path, f"domain {name}", hint="bits/char is measured on UTF-8 text: convert the file (e.g. "
                     "iconv -f SHIFT_JIS -t UTF-8) and try again")
    if not text.strip():
        raise BpcError(f"domain {name}: {path.name} is empty")
    return text


@checked_against(EvalOptions, "max_chars")
def cross_domain(models: list[str | Path], domains: dict[str, str | Path], max_chars: int | None = DOMAIN_CHARS,
                 progress: bool = True, shards: str | Path | None = None, device=None) -> dict:
    """bits/char for every model x domain (3LM truncates each domain to its first 400,000 chars); with `shards`,
    also every model on each source of that shard set's val split (as domains named `val:SOURCE`). `device`: where
    the models run (default: the best there is, `device_for`)."""
    texts = {name: read_domain(name, path) for name, path in domains.items()}
    if shards:  # before anything is measured
        check_same_tokenizer(models, shards)
    records = []
    for model_path in models:
        model, tok = load_model_and_tokenizer(model_path, device)
        measured = {"model": Path(model_path).name, "weights_sha256": weights_sha256(model_path)}
        for name, text in texts.items():
            records.append({**measured, **bits_per_char(model, tok, text, name, max_chars, progress=progress)})
        for row in shard_domain_bpc(model, tok, shards) if shards else []:
            if "bits_per_char" in row:
                records.append({**measured, **row, "domain": f"val:{row['domain']}"})
    return {"kind": "bits-per-char", "schema": 2, "window": WINDOW, "max_chars": max_chars, "markers": MARKER_RULE,
            "domains": {k: {"file": Path(v).name, "sha256": sha256_file(v)} for k, v in domains.items()},
            "records": records}


def check_same_tokenizer(models: list[str | Path], shards: str | Path) -> None:
    """Shards hold token ids; scored by a model with another tokenizer they mean other pieces, and bits/char comes
    out as a plausible, wrong number. The shard index records its tokenizer's sha256: it must be each model's."""
    index = load_index(Path(shards))
    recorded = index["tokenizer"]["sha256"]
    copy = Path(shards) / "tokenizer" / "tokenizer.json"  # the shards' own copy (verified against the index)
    for model_dir in map(Path, models):
        if not (model_dir / "tokenizer.json").is_file():
            raise BpcError(f"{model_dir}: no tokenizer.json, so nothing tells whether it reads {shards}'s token ids")
        mine = tokenizer_sha256(model_dir)
        if mine != recorded and not (copy.is_file() and _pieces(copy) == _pieces(model_dir / "tokenizer.json")):
            raise BpcError(f"{shards} was encoded with another tokenizer ({index['tokenizer'].get('name')}, sha256 "
                           f"{recorded[:12]}) than {model_dir.name}'s (sha256 {mine[:12]}): its ids would mean "
                           "other pieces to this model. Build shards with the model's tokenizer (hitoban shards "
                           f"--tokenizer {model_dir}) or measure on --domain text files")


def _pieces(tokenizer_json: Path) -> tuple:
    """What maps ids to text in a tokenizer.json (the model's vocabulary and the added tokens), without the
    formatting a re-save (the Trainer's, after SFT) changes."""
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    added = sorted((t["id"], t["content"]) for t in data.get("added_tokens", []))
    return json.dumps(data.get("model"), sort_keys=True), json.dumps(data.get("normalizer"), sort_keys=True), added


def shard_domain_bpc(model, tokenizer, shards: str | Path, max_tokens: int = 200_000) -> list[dict]:
    """Per-domain bits/char on a shard set's val split (domains from `.domains.u8`), over whole documents only:
    each document is preceded by the previous one's `<|end|>`, and the `<|end|>` tokens count on neither side."""
    reader = ShardReader(shards, "val")
    special = np.array(sorted(set(tokenizer.all_special_ids)), dtype=np.int64)
    rows = []
    for domain, documents in reader.domain_documents(max_tokens).items():
        ids = np.concatenate(documents)
        chars = sum(len(tokenizer.decode(doc.tolist(), skip_special_tokens=True)) for doc in documents)
        if chars == 0:
            rows.append({"domain": domain, "tokens": len(ids), "warning": "no text"})
            continue
        nats = token_nats(model, ids, reader.end_id)
        rows.append(_record(domain, nats, np.isin(ids, special), chars, WINDOW))
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
    return "\n".join(lines) + ("\n\nbits per character (lower is better; every character scored once, chat markers "
                                "on neither side); ⚠ = too few tokens for a stable value\n")


def plot_cross_domain(result: dict, path: str | Path) -> None:
    import matplotlib  # lazy: the Agg backend is chosen before pyplot loads; no figure, no matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after matplotlib.use("Agg")

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
    write_json(out, result)
    md, png = out.with_suffix(".md"), out.with_suffix(".png")
    md.write_text(markdown_table(result), encoding="utf-8")
    plot_cross_domain(result, png)
    return [out, md, png]
