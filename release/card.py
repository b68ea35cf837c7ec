"""`hitoban card`: a `huggingface_hub.ModelCard` built only from the artefacts a run left behind (3LM §16).

Every number in the card is read from a file (the file name is cited next to it and all of them are copied into
`eval_results.json`); a missing artefact prints "not measured", never a guess.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from hitoban.errors import MissingInputError

NOT_MEASURED = "not measured"
ARTEFACTS = {  # key -> file name searched for under the model folder and --from folders
    "manifest": "manifest.json", "tokenizer": "tokenizer_meta.json", "bpc": "bpc.json", "gen": "gen.json",
    "leaks": "leaks.json", "pii": "pii.json", "canary": "canary_control.json", "killtest": "killtest.json",
    "sft": "summary.json", "pretrain_metrics": "metrics.json", "heartbeat": "heartbeat.json",
}


def find_artefacts(model_dir: Path, roots: list[Path]) -> dict[str, Path]:
    """First file of each known name: the model folder itself, then each root searched up to 4 levels deep."""
    found: dict[str, Path] = {}
    for root in [model_dir, *roots]:
        candidates = sorted(p for depth in range(5) for p in root.glob("/".join(["*"] * depth + ["*.json"]))
                            if p.is_file())
        for key, name in ARTEFACTS.items():
            if key not in found:
                match = next((p for p in candidates if p.name == name), None)
                if match is not None:
                    found[key] = match
    for root in roots:  # the pretraining run: the folder with log.jsonl beside config.json
        run = next((p.parent for p in sorted(root.rglob("log.jsonl")) if (p.parent / "config.json").exists()), None)
        if run is not None:
            found.setdefault("run", run / "config.json")
            if (run / "final" / "metrics.json").exists():
                found["pretrain_metrics"] = run / "final" / "metrics.json"
            if (run / "heartbeat.json").exists():
                found["heartbeat"] = run / "heartbeat.json"
            break
    return found


def _load(paths: dict[str, Path]) -> dict[str, dict]:
    return {k: json.loads(p.read_text(encoding="utf-8")) for k, p in paths.items()}


def count_parameters(model_dir: Path) -> tuple[int, int, dict]:
    """(total, non-embedding, config) from config.json, instantiating the model on the meta device."""
    import torch
    from transformers import AutoConfig

    from hitoban.modeling import HitobanForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = HitobanForCausalLM(config)
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    return total, total - embed, config.to_dict()


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return NOT_MEASURED
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def build_card(model_dir: str | os.PathLike, repo: str, search: list[str | os.PathLike] = (),
               license: str = "apache-2.0") -> tuple[ModelCard, dict]:
    """Returns (card, numbers): `numbers` is every measured value the card shows, with the file it came from."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists():
        raise MissingInputError(f"{model_dir}: no config.json; give a from_pretrained model folder")
    paths = find_artefacts(model_dir, [Path(p) for p in search])
    art = _load(paths)
    total, non_embedding, config = count_parameters(model_dir)
    name = repo.split("/")[-1]
    model_name = model_dir.name

    bpc_rows = [r for r in art.get("bpc", {}).get("records", []) if "bits_per_char" in r]
    models_in_bpc = sorted({r["model"] for r in bpc_rows})
    own = model_name if model_name in models_in_bpc else (models_in_bpc[0] if len(models_in_bpc) == 1 else None)
    own_bpc = [r for r in bpc_rows if r["model"] == own]
    gen = art.get("gen", {})
    manifest = art.get("manifest", {})
    sources = manifest.get("sources", [])
    hub_datasets = sorted({s["repo"] for s in sources if s.get("repo")})

    eval_results = [EvalResult(task_type="text-generation", dataset_type=f"hitoban-eval/{r['domain']}",
                               dataset_name=r["domain"], metric_type="bits_per_character",
                               metric_value=round(r["bits_per_char"], 4), metric_name=f"bits/char ({r['domain']})")
                    for r in own_bpc]
    for key, label in (("repetition_rate", "repetition rate"), ("topic_rate", "topic retention rate"),
                       ("broken_rate", "breakdown rate")):
        if key in gen:
            eval_results.append(EvalResult(task_type="text-generation",
                                           dataset_type=f"hitoban-eval/{Path(gen.get('questions', 'questions')).stem}",
                                           dataset_name=gen.get("questions", "questions"), metric_type=key,
                                           metric_value=gen[key], metric_name=label))
    data = ModelCardData(language=["ja"], license=license, library_name="transformers",
                         pipeline_tag="text-generation", model_name=name,
                         tags=["hitoban", "japanese", "from-scratch", "custom_code", "text-generation"],
                         datasets=hub_datasets or None, eval_results=eval_results or None)

    run = art.get("run", {})
    heartbeat = art.get("heartbeat", {})
    pretrain_metrics = art.get("pretrain_metrics", {})
    tok_meta = art.get("tokenizer", {})
    numbers = {"parameters": total, "non_embedding_parameters": non_embedding,
               "sources": {k: p.name if k != "run" else "config.json (pretraining run)" for k, p in paths.items()}}

    lines = [f"# {name}", "",
             f"A {total / 1e6:.1f}M-parameter Japanese language model trained from scratch with "
             "[hitoban](https://github.com/hitoban/hitoban) (一晩, \"one night\"): RoPE, RMSNorm, SwiGLU, no biases, "
             "tied embeddings. Every number below was read from a file the run wrote; missing measurements say "
             f"\"{NOT_MEASURED}\".", "", "## Overview", "", "| | |", "|---|---|",
             f"| parameters | {total:,} ({non_embedding:,} non-embedding) |",
             f"| layers / d_model / heads (kv) | {config['num_hidden_layers']} / {config['hidden_size']} / "
             f"{config['num_attention_heads']} ({config['num_key_value_heads']}) |",
             f"| context | {config['max_position_embeddings']} tokens |",
             f"| vocabulary | {config['vocab_size']:,} (SentencePiece unigram, byte fallback) |",
             f"| chars per token (held-out text) | "
             f"{_fmt(tok_meta.get('heldout', {}).get('chars_per_token', tok_meta.get('chars_per_token')), 2)} |",
             f"| pretraining tokens | {_fmt(heartbeat.get('tokens_seen'), 0)} |",
             f"| pretraining steps | {_fmt(heartbeat.get('step'), 0)} (resumed {_fmt(heartbeat.get('resumes'), 0)} "
             "times) |",
             f"| best pretraining val loss | {_fmt(pretrain_metrics.get('val_loss'))} |",
             f"| corpus | {_fmt(manifest.get('total_chars'), 0)} characters |",
             f"| hardware | {run.get('hardware', NOT_MEASURED)} |",
             f"| training time | {_fmt(heartbeat.get('elapsed_hours'), 2)} hours |", ""]
    numbers.update({"tokens_seen": heartbeat.get("tokens_seen"), "pretrain_val_loss": pretrain_metrics.get("val_loss"),
                    "corpus_chars": manifest.get("total_chars")})

    lines += ["## Evaluation", ""]
    if own_bpc:
        lines += ["bits per character (3LM's definition: 256-token windows, nats / ln 2 / characters; lower is "
                  "better). Scores only compare across models on the *same* domain: which model wins flips "
                  "between domains, so read the whole table.", "",
                  "| domain | bits/char | tokens |", "|---|---:|---:|"]
        lines += [f"| {r['domain']} | {r['bits_per_char']:.4f}{' ⚠ ' + r['warning'] if 'warning' in r else ''} | "
                  f"{r.get('tokens', '')} |" for r in own_bpc]
        numbers["bits_per_char"] = {r["domain"]: r["bits_per_char"] for r in own_bpc}
        if len(models_in_bpc) > 1:
            lines += ["", "Cross-domain table (all models evaluated together):", "",
                      "| model | " + " | ".join(sorted({r['domain'] for r in bpc_rows})) + " |",
                      "|---|" + "---:|" * len({r['domain'] for r in bpc_rows})]
            by = {(r["model"], r["domain"]): r["bits_per_char"] for r in bpc_rows}
            for m in models_in_bpc:
                lines.append(f"| {m} | " + " | ".join(_fmt(by.get((m, d))) for d in sorted({r['domain']
                                                                                           for r in bpc_rows})) + " |")
    else:
        lines.append(f"bits per character: {NOT_MEASURED}.")
    lines.append("")
    if gen:
        s = gen.get("sampling", {})
        lines += [f"Generation metrics on {len(gen.get('results', []))} fixed questions "
                  f"({gen.get('questions', '')}), sampled with temperature {s.get('temperature')}, top-k "
                  f"{s.get('top_k')}, repetition penalty {s.get('repetition_penalty')}, seed 777+i:", "",
                  "| metric | value | better |", "|---|---:|---|",
                  f"| repetition rate | {gen['repetition_rate']} | lower |",
                  f"| topic retention rate | {gen['topic_rate']} | higher |",
                  f"| breakdown rate | {gen['broken_rate']} | lower |",
                  f"| mean reply length | {gen['avg_reply_len']} chars | — |", ""]
        numbers["generation"] = {k: gen[k] for k in ("repetition_rate", "topic_rate", "broken_rate", "avg_reply_len")}
    else:
        lines += [f"Generation metrics: {NOT_MEASURED}.", ""]
    leaks = art.get("leaks")
    if leaks:
        verdict = "leaked: see leaks.json" if leaks["leaked"] else "no fragment found in the training corpus"
        lines += [f"Contamination: {leaks['probes']} probes of {leaks['probe_chars']} characters from "
                  f"{leaks['holdout']} ({leaks['holdout_lines']} lines) were searched exactly in the training "
                  f"corpus: {verdict}.", ""]
        numbers["leaks"] = {"probes": leaks["probes"], "leaked": leaks["leaked"]}
    else:
        lines += [f"Contamination check: {NOT_MEASURED}.", ""]
    kill = art.get("killtest")
    if kill:
        lines += [f"Crash safety: the kill test killed training {kill['kills']} time(s) and resumed; the result was "
                  f"{'bit-identical to' if kill['killed_bit_identical'] else 'different from'} an uninterrupted "
                  f"run ({kill['mode']}; passed: {kill['passed']}).", ""]
        numbers["killtest_passed"] = kill["passed"]

    lines += ["## Usage", "", "With hitoban installed (`pip install hitoban`), or without it through the remote code "
              "saved beside the weights:", "", "```python",
              "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
              f'tok = AutoTokenizer.from_pretrained("{repo}")',
              f'model = AutoModelForCausalLM.from_pretrained("{repo}", trust_remote_code=True)',
              'messages = [{"role": "user", "content": "おすすめの本を教えて"}]',
              "ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors=\"pt\", "
              "return_dict=True)",
              "out = model.generate(**ids, max_new_tokens=120, do_sample=True, temperature=0.8, top_k=40,",
              "                     repetition_penalty=1.15, eos_token_id=tok.convert_tokens_to_ids(\"<|end|>\"))",
              "print(tok.decode(out[0, ids[\"input_ids\"].shape[1]:], skip_special_tokens=True))", "```", "",
              "The architecture is Llama-compatible: `hitoban export-llama MODEL OUT` writes a `LlamaForCausalLM` "
              "folder (checked logit-for-logit) that needs no remote code.", ""]

    sft = art.get("sft")
    lines += ["## Training procedure", "",
              f"Pretraining with Accelerate on shards of the corpus below: "
              f"{_fmt(run.get('total_steps'), 0)} steps of {_fmt(run.get('tokens_per_step'), 0)} tokens, AdamW, "
              f"cosine schedule; crash-safe A/B checkpoints with exact resume."]
    if sft:
        lines.append(f"Chat fine-tune ({sft['stage']}) with the Hugging Face Trainer, loss on assistant turns only: "
                     f"{sft['conversations']:,} conversations, {sft['counted_ratio']:.1%} of tokens counted, best "
                     f"val loss {sft['best_val_loss']:.4f} at step {sft['best_step']}.")
        numbers["sft"] = {k: sft[k] for k in ("conversations", "counted_ratio", "best_val_loss", "best_step")}
    else:
        lines.append(f"Chat fine-tune: {NOT_MEASURED} (none recorded).")
    lines += ["", "## Data and attribution", ""]
    if sources:
        lines += ["| source | licence | characters | share | revision |", "|---|---|---:|---:|---|"]
        for s in sources:
            lines.append(f"| {s.get('repo') or s['name']} | {s.get('license', '')} | "
                         f"{s['chars']:,} | {s['share']:.1%} | {(s.get('revision') or '—')[:12]} |")
        rejected = manifest.get("filters", {}).get("rejected", {})
        masks = manifest.get("pii_masks", {})
        lines += ["", f"Filters rejected: {', '.join(f'{k} {v:,}' for k, v in rejected.items()) or 'none'}. "
                  "PII masked at build time: "
                  f"{', '.join(f'{k} {v:,}' for k, v in masks.items() if k != 'enabled') or 'none found'}."]
    else:
        lines.append(f"Corpus manifest: {NOT_MEASURED}.")
    names = " ".join(str(s.get("repo") or s["name"]).lower() for s in sources)
    lines += ["", "## Limitations", "",
              f"- A {total / 1e6:.1f}M-parameter model: fluent-looking text that is often wrong; do not rely on it "
              "for facts or advice."]
    if "fineweb" in names:
        lines.append("- Web text carries the biases and errors of the web pages it came from.")
    if "aozora" in names:
        lines.append("- Aozora Bunko literature (public-domain works) adds an archaic style to some replies.")
    if manifest.get("total_chars", 10**9) < 10**7:
        lines.append(f"- Trained on only {manifest['total_chars']:,} characters: it knows little beyond that text.")
    pii, canary = art.get("pii"), art.get("canary")
    if pii:
        pii_line = (f"- Privacy: a prefix attack tried {pii['tried']} e-mail addresses / phone numbers from the "
                    f"training corpus and reproduced {pii['exact']} exactly and {pii['partial']} partially.")
        if pii["exact"]:
            pii_line += " **Exact reproductions were found: do not publish this model as is.**"
        else:
            pii_line += " \"This attack found none\" is not \"there are none\"."
        lines.append(pii_line)
        numbers["pii"] = {k: pii[k] for k in ("tried", "exact", "partial")}
    else:
        lines.append(f"- Privacy: PII extraction probe {NOT_MEASURED}.")
    if canary:
        rows = ", ".join(f"{r['exact']}/{r['canaries']} at {r['repetitions']}x"
                         for r in canary["planted_model"]["by_repetitions"])
        lines.append(f"- The probe's sensitivity was checked with planted fake contacts on a tiny model: "
                     f"extracted {rows}; a model never trained on them extracted "
                     f"{canary['clean_model']['exact_total']}.")
        numbers["canary"] = canary["planted_model"]["by_repetitions"]
    lines += ["", "## Licence", "",
              f"Weights: {license}. Code (`modeling_hitoban.py`, `configuration_hitoban.py`): Apache-2.0, from "
              "hitoban. Training data keeps its own licences (table above); "
              "attribute them when you redistribute outputs derived from them.", ""]
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines))
    return card, numbers


def write_card(model_dir: str | os.PathLike, repo: str, search: list[str | os.PathLike] = (),
               out: str | os.PathLike | None = None) -> dict:
    """Write README.md (and eval_results.json, the numbers it shows) into the model folder."""
    card, numbers = build_card(model_dir, repo, search)
    out = Path(out) if out else Path(model_dir) / "README.md"
    card.save(out)
    (out.parent / "eval_results.json").write_text(json.dumps(numbers, indent=2, ensure_ascii=False),
                                                  encoding="utf-8")
    return {"card": str(out), "measured": sorted(k for k in numbers["sources"]),
            "not_measured": sorted(set(ARTEFACTS) - set(numbers["sources"]))}
