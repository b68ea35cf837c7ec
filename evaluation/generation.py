"""`hitoban eval gen`: 3LM's generation metrics on fixed questions (docs/design.md §12).

Sampling exactly as 3LM: per step, (1) CTRL repetition penalty 1.15 over the distinct tokens among the last 64
*generated* tokens (prompt excluded), (2) temperature 0.8, (3) top-k 40 (ties at the threshold kept), then sample;
200 new tokens at most; stop at <|end|> or <|user|>; the RNG is seeded with 777 + i before question i. The three
steps run as our own logits processors in that order (transformers' built-in penalty counts prompt tokens and its
warpers would run in another order). Multi-turn items are answered turn by turn; only the last reply is scored.

Per reply: repetition = length >= 9 and some character 3-gram occurs >= 3 times; broken = stripped reply shorter
than 4 chars, or truncated (hit the token limit), or contains "<|unk|>"; keyword hit = any keyword is a substring
(None for items without keywords). Rates are over all items (topic rate over items with keywords).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch
from transformers import DynamicCache, LogitsProcessor, LogitsProcessorList

from hitoban.errors import InputError
from hitoban.files import read_text
from hitoban.modeling.loading import load_model_and_tokenizer
from hitoban.provenance import weights_sha256, write_json

SAMPLING = {"temperature": 0.8, "top_k": 40, "repetition_penalty": 1.15, "penalty_window": 64,
            "max_new_tokens": 200, "seed": 777}
BETTER = {"repetition_rate": "lower", "topic_rate": "higher", "broken_rate": "lower", "avg_reply_len": None}


class GeneratedTokenPenalty(LogitsProcessor):
    """CTRL penalty on distinct tokens among the last `window` generated tokens (never the prompt)."""

    def __init__(self, prompt_length: int, penalty: float, window: int = 64):
        self.prompt_length, self.penalty, self.window = prompt_length, penalty, window

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        generated = input_ids[:, self.prompt_length :][:, -self.window :]
        if self.penalty == 1.0 or generated.shape[1] == 0:
            return scores
        for row in range(scores.shape[0]):
            ids = generated[row].unique()
            values = scores[row, ids]
            scores[row, ids] = torch.where(values > 0, values / self.penalty, values * self.penalty)
        return scores


class Temperature(LogitsProcessor):
    def __init__(self, temperature: float):
        self.temperature = temperature

    def __call__(self, input_ids, scores):
        return scores / self.temperature


class TopKKeepTies(LogitsProcessor):
    """Keep logits >= the k-th largest (3LM keeps ties at the threshold)."""

    def __init__(self, k: int):
        self.k = k

    def __call__(self, input_ids, scores):
        if 0 < self.k < scores.shape[-1]:
            threshold = scores.topk(self.k, dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < threshold, float("-inf"))
        return scores


class QuestionsError(InputError):
    """A malformed questions file; names the file and line."""


def load_questions(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise QuestionsError(f"{path}: questions file not found")
    items = []
    for number, line in enumerate(read_text(path, "questions").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise QuestionsError(f"{path.name}:{number}: not valid JSON ({err.msg})") from None
        if not isinstance(item, dict) or not item.get("turns") or not all(isinstance(t, str) for t in item["turns"]):
            raise QuestionsError(f"{path.name}:{number}: needs a non-empty list of strings under 'turns'")
        items.append({"id": item.get("id", f"q{number}"), "category": item.get("category", ""),
                      "turns": item["turns"], "keywords": item.get("keywords")})
    if not items:
        raise QuestionsError(f"{path.name}: no questions")
    return items


def is_repetitive(reply: str) -> bool:
    return len(reply) >= 9 and max(Counter(reply[i : i + 3] for i in range(len(reply) - 2)).values()) >= 3


def score_replies(items: list[dict], replies: list[str], truncated: list[bool]) -> dict:
    """Per-item flags and the summary metrics (pure: tests feed replies directly)."""
    results = []
    for item, reply, cut in zip(items, replies, truncated):
        keywords = item.get("keywords")
        results.append({**item, "reply": reply, "truncated": cut, "repetition": is_repetitive(reply),
                        "broken": len(reply.strip()) < 4 or cut or "<|unk|>" in reply,
                        "keyword_hit": any(k in reply for k in keywords) if keywords else None})
    with_keywords = [r for r in results if r["keyword_hit"] is not None]
    n = len(results)
    return {"repetition_rate": round(sum(r["repetition"] for r in results) / n, 3),
            "topic_rate": round(sum(r["keyword_hit"] for r in with_keywords) / len(with_keywords), 3)
            if with_keywords else None,
            "broken_rate": round(sum(r["broken"] for r in results) / n, 3),
            "avg_reply_len": round(sum(len(r["reply"]) for r in results) / n, 1), "results": results}


def sampling_processors(prompt_length: int, settings: dict) -> tuple[LogitsProcessorList, dict]:
    """3LM's chain (penalty on generated tokens, temperature, top-k with ties) + the generate() flags that go with it:
    transformers' own temperature/top-k are neutralised when sampling and not passed at all when greedy."""
    sample = settings["temperature"] > 0
    processors = LogitsProcessorList(
        [GeneratedTokenPenalty(prompt_length, settings["repetition_penalty"], settings["penalty_window"])]
        + ([Temperature(settings["temperature"]), TopKKeepTies(settings["top_k"])] if sample else []))
    flags = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if sample else dict(do_sample=False)
    return processors, flags


@torch.no_grad()
def decode(model, ids: torch.Tensor, processors: LogitsProcessorList, sample: bool, stops: list[int],
           max_new_tokens: int, streamer=None) -> torch.Tensor:
    """`generate()`'s sampling loop for one sequence, without its per-step machinery (stopping criteria, input
    preparation, mask rebuilding): the same float32 scores, the same processors, the same `multinomial` draws in
    the same order, so greedy tokens and seeded samples are identical (tested). Returns prompt + new tokens."""
    cache = DynamicCache(config=model.config)
    sequence = ids.to(model.device)
    if streamer is not None:
        streamer.put(sequence.cpu())
    logits = model(sequence, cache=cache, use_cache=True, logits_to_keep=1).logits
    for _ in range(max_new_tokens):
        scores = processors(sequence, logits[:, -1, :].to(dtype=torch.float32, copy=True))
        if sample:
            token = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1)
        else:
            token = scores.argmax(dim=-1, keepdim=True)
        sequence = torch.cat([sequence, token], dim=-1)
        if streamer is not None:
            streamer.put(token.cpu())
        if int(token) in stops:
            break
        logits = model(token, cache=cache, use_cache=True).logits
    if streamer is not None:
        streamer.end()
    return sequence


def reply(model, tokenizer, history: list[dict], settings: dict, streamer=None) -> tuple[str, bool]:
    """One chat reply for `history` (ending with a user turn); returns (text, truncated). Temperature <= 0: greedy."""
    ids = tokenizer.apply_chat_template(history, add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]
    room = model.config.max_position_embeddings - settings["max_new_tokens"]
    ids = ids[:, -max(room, 16):]
    stops = [tokenizer.convert_tokens_to_ids(t) for t in ("<|end|>", "<|user|>")]
    processors, flags = sampling_processors(ids.shape[1], settings)
    out = decode(model, ids, processors, flags["do_sample"], stops, settings["max_new_tokens"], streamer)
    new = out[0, ids.shape[1]:].tolist()
    truncated = len(new) >= settings["max_new_tokens"] and not (new and new[-1] in stops)
    return tokenizer.decode(new, skip_special_tokens=True), truncated


def generation_metrics(model, tokenizer, items: list[dict], settings: dict | None = None, progress=None) -> dict:
    settings = {**SAMPLING, **(settings or {})}
    model.eval()
    replies, truncated = [], []
    for i, item in enumerate(items):
        torch.manual_seed(settings["seed"] + i)
        history: list[dict] = []
        for turn in item["turns"]:
            history.append({"role": "user", "content": turn})
            text, cut = reply(model, tokenizer, history, settings)
            history.append({"role": "assistant", "content": text})
        replies.append(text)
        truncated.append(cut)
        if progress:
            progress(item, text)
    return {**score_replies(items, replies, truncated), "sampling": settings}


def evaluate_generation(model_dir: str | Path, questions: str | Path, out: str | Path | None = None,
                        settings: dict | None = None, limit: int | None = None, progress=None, device=None) -> dict:
    """`hitoban eval gen`: 3LM's generation metrics for one model folder on a questions file, as a report that names
    the weights it measured (also written to `out`). `device`: where the model runs (default: the best there is)."""
    items = load_questions(questions)[:limit]
    model, tokenizer = load_model_and_tokenizer(model_dir, device, chat_template=True)
    report = {"kind": "generation-metrics", "schema": 1, "model": Path(model_dir).name,
              "weights_sha256": weights_sha256(model_dir), "questions": Path(questions).name,
              **generation_metrics(model, tokenizer, items, settings, progress)}
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)  # `--out reports/gen.json` into a folder not made yet
        write_json(out, report)
    return report


def compare(current: dict, previous: dict) -> list[str]:
    """One line per metric: the delta and whether it moved in the better direction."""
    lines = []
    for metric, better in BETTER.items():
        a, b = current.get(metric), previous.get(metric)
        if a is None or b is None:
            continue
        delta = a - b
        verdict = ("unchanged" if delta == 0 else "changed" if better is None
                   else "better" if (delta < 0) == (better == "lower") else "worse")
        lines.append(f"{metric:<16} {b:>8} -> {a:>8}  ({delta:+.3f}, {verdict}; {better or 'no'} is better)")
    return lines
