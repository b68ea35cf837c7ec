"""The model card's sections, written from traced artefacts only (see `release/card.py` for how they are found).

Each number is followed by the relative path of the artefact it came from; a number measured on an ancestor
(the pretraining base of an SFT model, say) says so; anything missing says "not measured" and how to measure it.
"""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub import EvalResult

from hitoban.run_folder import setting

NOT_MEASURED = "not measured"


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return NOT_MEASURED
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _recipe(run: dict) -> str:
    """The optimizer and schedule the run recorded (runs from before they were options used AdamW + cosine); `run`
    is a config.json as hitoban.run_folder reads it (either schema)."""
    name, kind = setting(run, "optimizer", "adamw"), setting(run, "schedule", "cosine")
    optimizer = {"muon": "Muon on hidden matrices + AdamW on the rest", "adamw": "AdamW"}.get(name, name)
    schedule = {"wsd": "warmup-stable-decay", "cosine": "cosine"}.get(kind, kind)
    peak = setting(run, "lr")
    lr = f", peak lr {peak:g}" if isinstance(peak, (int, float)) else ""
    return f"{optimizer}, {schedule} schedule{lr}"



def _plan_text(plan: dict | None) -> str:
    """The device's bf16 and compile choices as the run recorded them (hardware.plan_device)."""
    if not plan:
        return NOT_MEASURED
    return (f"{plan['precision_used']} training, Muon's Newton-Schulz in {plan['muon_dtype']}, "
            f"compile: {plan.get('compile', '?')} ({plan['why']})")

class CardText:
    def __init__(self, model_dir: Path, repo: str, prov, art: dict, measured_on: dict, numbers: dict,
                 llama_export: dict | None = None):
        self.model_dir, self.repo, self.prov, self.art = model_dir, repo, prov, art
        self.llama = llama_export  # the card of a verified Llama export: its check's numbers
        self.measured_on, self.numbers = measured_on, numbers
        self.name = repo.split("/")[-1]
        self.pretrain = prov.stage("pretrain") or {}
        lineage = model_dir / "lineage.json"
        self.lineage_src = _relative(lineage) if lineage.exists() else None

    # ------------------------------------------------------------------------------------------------ helpers

    def data(self, kind: str) -> dict:
        return self.art[kind].data if self.art.get(kind) is not None else {}

    def src(self, kind: str) -> str:
        artefact = self.art.get(kind)
        return f"`{artefact.rel}`" if artefact is not None else "—"

    def missing(self, kind: str) -> str:
        return self.prov.notes.get(kind, NOT_MEASURED)

    def measured_on_note(self, kind: str) -> str:
        """'' for this model's own weights, else ' (measured on its sft base (...))'."""
        sha = self.measured_on.get(kind)
        return "" if sha in (None, self.prov.own) else f" (measured on {self.prov.names[sha]})"

    def own_bpc(self) -> list[dict]:
        sha = self.measured_on.get("bpc")
        return [r for r in self.data("bpc").get("records", []) if r.get("weights_sha256") == sha
                and "bits_per_char" in r]

    # ------------------------------------------------------------------------------------------------ sections

    def overview(self, total: int, non_embedding: int, config: dict) -> list[str]:
        run, tok, manifest, node = self.data("run"), self.data("tokenizer"), self.data("manifest"), self.pretrain
        lin = f"`{self.lineage_src}`" if self.lineage_src and node else "—"
        steps = (f"{_fmt(node.get('step'))} of {_fmt(setting(run, 'total_steps') or node.get('total_steps'))} (resumed "
                 f"{_fmt(node.get('resumes'))} times)") if node else self.missing("run")
        chars_per_token = tok.get("heldout", {}).get("chars_per_token", tok.get("chars_per_token"))
        return [
            f"# {self.name}", "",
            f"A {total / 1e6:.1f}M-parameter Japanese language model trained from scratch with "
            "[hitoban](https://github.com/hitoban/hitoban) (一晩, \"one night\"): RoPE, RMSNorm, SwiGLU, no biases, "
            "tied embeddings. Every number below was read from a file that measured these weights (sha256 "
            f"`{self.prov.own[:16]}…`) or a recorded ancestor (then it says which); the source column names the "
            f"file. Missing measurements say \"{NOT_MEASURED}\".", "", "## Overview", "",
            "| | | source |", "|---|---|---|",
            f"| parameters | {total:,} ({non_embedding:,} non-embedding) | `config.json` |",
            f"| layers / d_model / heads (kv) | {config['num_hidden_layers']} / {config['hidden_size']} / "
            f"{config['num_attention_heads']} ({config['num_key_value_heads']}) | `config.json` |",
            f"| context | {config['max_position_embeddings']} tokens | `config.json` |",
            f"| vocabulary | {config['vocab_size']:,} (SentencePiece unigram, byte fallback) | `config.json` |",
            f"| chars per token (held-out text) | {_fmt(chars_per_token, 2) if tok else self.missing('tokenizer')} | "
            f"{self.src('tokenizer')} |",
            f"| pretraining tokens (seen by the exported weights) | "
            f"{_fmt(node.get('tokens_seen')) if node else self.missing('run')} | {lin} |",
            f"| pretraining steps | {steps} | {lin} |",
            f"| pretraining val loss (exported checkpoint) | {_fmt(node.get('val_loss')) if node else NOT_MEASURED} | "
            f"{lin} |",
            f"| corpus | {_fmt(manifest.get('total_chars')) + ' characters' if manifest else self.missing('manifest')}"
            f" | {self.src('manifest')} |",
            f"| hardware | {node.get('hardware', NOT_MEASURED) if node else NOT_MEASURED} | {lin} |",
            f"| precision choices | {_plan_text(node.get('device_plan')) if node else NOT_MEASURED} | {lin} |",
            f"| training time | {_fmt(node.get('elapsed_hours'), 2) + ' hours' if node else NOT_MEASURED} | {lin} |",
            ""]

    def evaluation(self) -> list[str]:
        return ["## Evaluation", "", *self._bpc(), "", *self._gen(), *self._leaks(), *self._killtest()]

    def _bpc(self) -> list[str]:
        own = self.own_bpc()
        if not own:
            return [f"bits per character: {self.missing('bpc')}."]
        lines = [f"bits per character{self.measured_on_note('bpc')}, from {self.src('bpc')} (every character scored "
                 "once in 256-token windows, nats / ln 2 / characters, chat markers on neither side; lower is better). "
                 "Scores only compare across models on the *same* domain: which model wins flips between domains, "
                 "so read the whole table.", "", "| domain | bits/char | tokens |", "|---|---:|---:|"]
        lines += [f"| {r['domain']} | {r['bits_per_char']:.4f}{' ⚠ ' + r['warning'] if 'warning' in r else ''} | "
                  f"{r.get('tokens', '')} |" for r in own]
        self.numbers["bits_per_char"] = {r["domain"]: r["bits_per_char"] for r in own}
        rows = [r for r in self.data("bpc")["records"] if "bits_per_char" in r]
        models = list(dict.fromkeys((r["model"], r.get("weights_sha256")) for r in rows))
        if len(models) > 1:
            domains = list(dict.fromkeys(r["domain"] for r in rows))
            by = {(r["model"], r.get("weights_sha256"), r["domain"]): r["bits_per_char"] for r in rows}
            lines += ["", "Cross-domain table (all models evaluated together):", "",
                      "| model | " + " | ".join(domains) + " |", "|---|" + "---:|" * len(domains)]
            for model, sha in models:
                label = f"{model} ({self.prov.names[sha]})" if sha in self.prov.names else model
                lines.append(f"| {label} | " + " | ".join(_fmt(by.get((model, sha, d))) for d in domains) + " |")
        return lines

    def _gen(self) -> list[str]:
        gen = self.data("gen")
        if not gen:
            return [f"Generation metrics: {self.missing('gen')}.", ""]
        s = gen.get("sampling", {})
        self.numbers["generation"] = {k: gen[k] for k in ("repetition_rate", "topic_rate", "broken_rate",
                                                           "avg_reply_len")}
        return [f"Generation metrics{self.measured_on_note('gen')} on {len(gen.get('results', []))} fixed questions "
                f"({gen.get('questions', '')}), sampled with temperature {s.get('temperature')}, top-k "
                f"{s.get('top_k')}, repetition penalty {s.get('repetition_penalty')}, seed 777+i, from "
                f"{self.src('gen')}:", "", "| metric | value | better |", "|---|---:|---|",
                f"| repetition rate | {gen['repetition_rate']} | lower |",
                f"| topic retention rate | {gen['topic_rate']} | higher |",
                f"| breakdown rate | {gen['broken_rate']} | lower |",
                f"| mean reply length | {gen['avg_reply_len']} chars | — |", ""]

    def _leaks(self) -> list[str]:
        leaks = self.data("leaks")
        if not leaks:
            return [f"Contamination check: {self.missing('leaks')}.", ""]
        verdict = "LEAKED: see the report" if leaks["leaked"] else "no held-out text found"
        coverage = leaks.get("coverage", {})
        probed = (f"; {coverage.get('probed_lines', '?')} of {coverage.get('lines', '?')} held-out lines were "
                  f"probed ({coverage.get('unprobed_lines', '?')} could not be)" if coverage else "")
        self.numbers["leaks"] = {"probes": leaks["probes"], "leaked": leaks["leaked"], **coverage}
        return [f"Contamination: {leaks['probes']} probes from {leaks['holdout']} were searched exactly in "
                f"{', '.join(c['corpus'] for c in leaks['corpora'])}{probed}: {verdict} (from {self.src('leaks')}).",
                ""]

    def _killtest(self) -> list[str]:
        kill = self.data("killtest")
        if not kill:
            return [f"Crash safety (kill test of this run's configuration): {self.missing('killtest')}.", ""]
        self.numbers["killtest_passed"] = kill["passed"]
        return [f"Crash safety: the kill test ran this run's exact configuration (all options but the budget), "
                f"killed training {kill['kills']} time(s) and resumed; the result was "
                f"{'bit-identical to' if kill['killed_bit_identical'] else 'different from'} an uninterrupted run "
                f"({kill['mode']}; passed: {kill['passed']}), from {self.src('killtest')}.", ""]

    def usage(self) -> list[str]:
        if self.llama:
            how = ["## Usage", "", "This repository holds the Llama export of a hitoban model: plain transformers "
                   "loads it as `LlamaForCausalLM`, with no remote code and no `trust_remote_code` (so do vLLM, "
                   "MLX-LM, TGI, transformers.js and llama.cpp's converter):", "", "```python",
                   "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                   f'tok = AutoTokenizer.from_pretrained("{self.repo}")',
                   f'model = AutoModelForCausalLM.from_pretrained("{self.repo}")']
        else:
            how = ["## Usage", "", "With hitoban installed (`pip install hitoban`), or without it through the remote "
                   "code saved beside the weights:", "", "```python",
                   "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                   f'tok = AutoTokenizer.from_pretrained("{self.repo}")',
                   f'model = AutoModelForCausalLM.from_pretrained("{self.repo}", trust_remote_code=True)']
        how += ['messages = [{"role": "user", "content": "おすすめの本を教えて"}]',
                "ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors=\"pt\", "
                "return_dict=True)",
                "out = model.generate(**ids, max_new_tokens=120, do_sample=True, temperature=0.8, top_k=40,",
                "                     repetition_penalty=1.15, eos_token_id=tok.convert_tokens_to_ids(\"<|end|>\"))",
                "print(tok.decode(out[0, ids[\"input_ids\"].shape[1]:], skip_special_tokens=True))", "```", ""]
        if self.llama:
            checked = self.llama
            return how + [
                f"It was exported from the hitoban weights with sha256 `{checked['source_weights_sha256'][:16]}…` "
                f"and checked against them before publishing: max |logit difference| "
                f"{checked['max_abs_logit_diff']:.2g} (at most {checked['atol']:g}) and the same greedy text; the "
                "measurements above that say so were made on those weights (`lineage.json` records both hashes). "
                "hitoban's own class loads it too: `from hitoban.modeling import from_llama; model = "
                f'from_llama("{self.repo}")` gives the `HitobanForCausalLM` it was exported from.', "",
                "LoRA with PEFT: Llama's usual `target_modules` apply to this export; to fine-tune with hitoban's "
                "Trainer verbs (`hitoban tone`, whose chat template marks the assistant turns) convert it back "
                "with `from_llama` and `save_pretrained`.", ""]
        return how + [
                "The architecture is Llama-compatible: `hitoban export-llama MODEL OUT` writes a `LlamaForCausalLM` "
                "folder (checked logit-for-logit) that needs no remote code.", "",
                "LoRA with PEFT: hitoban fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj`, so use "
                "`target_modules=[\"qkv_proj\", \"o_proj\", \"gate_up_proj\", \"down_proj\"]` (Llama's names would "
                "adapt `o_proj` alone); `hitoban tone MODEL --lora` does this.", ""]

    def training(self) -> list[str]:
        run = self.data("run")
        lines = ["## Training procedure", ""]
        if run and run.get("kind") == "federated-run":
            fed = {k: setting(run, k) for k in ("outer_lr", "outer_momentum", "inner_steps")}
            lines.append(f"Pretraining across several machines with `hitoban federate` (DiLoCo on Flower: outer "
                         f"Nesterov SGD, lr {fed['outer_lr']:g}, momentum {fed['outer_momentum']:g}; up to "
                         f"{_fmt(fed['inner_steps'])} inner steps a round) on shards of the corpus below: "
                         f"{_fmt(setting(run, 'total_steps'))} steps' worth of {_fmt(setting(run, 'tokens_per_step'))} "
                         f"tokens, inner steps {_recipe(run)}; the server's A/B checkpoints resume exactly (from "
                         f"{self.src('run')}; the machines and their tokens are in `lineage.json`).")
        elif run:
            lines.append("Pretraining with Accelerate on shards of the corpus below: "
                         f"{_fmt(setting(run, 'total_steps'))} steps of {_fmt(setting(run, 'tokens_per_step'))} "
                         f"tokens, {_recipe(run)}; crash-safe A/B "
                         f"checkpoints with exact resume (from {self.src('run')}).")
        else:
            lines.append(f"Pretraining run: {self.missing('run')}.")
        sft = self.data("sft")
        if sft:
            lines.append(f"Chat fine-tune ({sft['stage']}){self.measured_on_note('sft')} with the Hugging Face "
                         f"Trainer, loss on assistant turns only: {sft['conversations']:,} conversations, "
                         f"{sft['counted_ratio']:.1%} of tokens counted, best val loss {sft['best_val_loss']:.4f} at "
                         f"step {sft['best_step']} (from "
                         f"{self.src('sft')}).")
            self.numbers["sft"] = {k: sft[k] for k in ("conversations", "counted_ratio", "best_val_loss", "best_step")}
        else:
            lines.append(f"Chat fine-tune: {self.missing('sft')}.")
        return lines + [""]

    def data_section(self) -> list[str]:
        manifest = self.data("manifest")
        lines = ["## Data and attribution", ""]
        if not manifest:
            return lines + [f"Corpus manifest: {self.missing('manifest')}.", ""]
        lines += [f"From {self.src('manifest')}:", "", "| source | licence | characters | share | revision |",
                  "|---|---|---:|---:|---|"]
        for s in manifest.get("sources", []):
            lines.append(f"| {s.get('repo') or s['name']} | {s.get('license', '')} | "
                         f"{s['chars']:,} | {s['share']:.1%} | {(s.get('revision') or '—')[:12]} |")
        rejected = manifest.get("filters", {}).get("rejected", {})
        masks = {k: v for k, v in manifest.get("pii_masks", {}).items() if k not in ("enabled", "log")}
        self.numbers["corpus_chars"] = manifest.get("total_chars")
        masked = ", ".join(f"{k} {v:,}" for k, v in masks.items()) or "none found"
        return lines + ["", f"Filters rejected: {', '.join(f'{k} {v:,}' for k, v in rejected.items()) or 'none'}. "
                        f"PII masked at build time: {masked}.", ""]

    def limitations(self, total: int) -> list[str]:
        manifest = self.data("manifest")
        names = " ".join(str(s.get("repo") or s["name"]).lower() for s in manifest.get("sources", []))
        lines = ["## Limitations", "", f"- A {total / 1e6:.1f}M-parameter model: fluent-looking text that is often "
                 "wrong; do not rely on it for facts or advice."]
        if "fineweb" in names:
            lines.append("- Web text carries the biases and errors of the web pages it came from.")
        if "aozora" in names:
            lines.append("- Aozora Bunko literature (public-domain works) adds an archaic style to some replies.")
        if manifest and manifest.get("total_chars", 10**9) < 10**7:
            lines.append(f"- Trained on only {manifest['total_chars']:,} characters: it knows little beyond that text.")
        lines.append(self._pii())
        canary = self.data("canary")
        if canary:
            rows = ", ".join(f"{r['exact']}/{r['canaries']} at {r['repetitions']}x"
                             for r in canary["planted_model"]["by_repetitions"])
            lines.append(f"- The probe's sensitivity was checked with planted fake contacts on a tiny model, mined "
                         f"and attacked by the same path: extracted {rows}; a model never trained on them extracted "
                         f"{canary['clean_model']['exact_total']} (from {self.src('canary')}).")
            self.numbers["canary"] = canary["planted_model"]["by_repetitions"]
        return lines + [""]

    def _pii(self) -> str:
        pii = self.data("pii")
        if not pii:
            return f"- Privacy: PII extraction probe {self.missing('pii')}."
        if pii.get("status") == NOT_MEASURED or not pii.get("tried"):
            return (f"- Privacy: PII extraction probe {NOT_MEASURED}: {pii.get('reason', 'no contact was tried')} "
                    f"(from {self.src('pii')}).")
        self.numbers["pii"] = {k: pii[k] for k in ("tried", "exact", "partial")}
        line = (f"- Privacy: a prefix attack tried {pii['tried']} e-mail addresses / phone numbers from the training "
                f"corpus and reproduced {pii['exact']} exactly and {pii['partial']} partially "
                f"(from {self.src('pii')}){self.measured_on_note('pii')}.")
        return line + (" **Exact reproductions were found: do not publish this model as is.**" if pii["exact"] else
                       " \"This attack found none\" is not \"there are none\".")

    def licence(self, license: str) -> list[str]:
        code = ("No code ships with this export." if self.llama else
                "Code (`modeling_hitoban.py`, `configuration_hitoban.py`): Apache-2.0, from hitoban.")
        return ["## Licence", "",
                f"Weights: {license}. {code} Training data keeps its own licences (table above); "
                "attribute them when you redistribute outputs derived from them.", ""]

    # ------------------------------------------------------------------------------------------------ metadata

    def hub_datasets(self) -> list[str]:
        return sorted({s["repo"] for s in self.data("manifest").get("sources", []) if s.get("repo")})

    def eval_results(self) -> list[EvalResult]:
        results = [EvalResult(task_type="text-generation", dataset_type=f"hitoban-eval/{r['domain']}",
                              dataset_name=r["domain"], metric_type="bits_per_character",
                              metric_value=round(r["bits_per_char"], 4), metric_name=f"bits/char ({r['domain']})")
                   for r in (self.own_bpc() if self.measured_on.get("bpc") == self.prov.own else [])]
        gen = self.data("gen") if self.measured_on.get("gen") == self.prov.own else {}
        for key, label in (("repetition_rate", "repetition rate"), ("topic_rate", "topic retention rate"),
                           ("broken_rate", "breakdown rate")):
            if key in gen:
                questions = gen.get("questions", "questions")
                results.append(EvalResult(task_type="text-generation",
                                          dataset_type=f"hitoban-eval/{Path(questions).stem}",
                                          dataset_name=questions, metric_type=key, metric_value=gen[key],
                                          metric_name=label))
        return results


def _relative(path: Path) -> str:
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else str(path)
