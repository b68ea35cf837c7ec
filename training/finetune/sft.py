"""`hitoban sft` / `hitoban tone`: chat fine-tuning with the HF Trainer, loss only on what the assistant says.

Labels come from the tokenizer's chat template (`return_assistant_tokens_mask`): -100 everywhere except assistant
content and its closing <|end|> (so the model learns to stop), in every assistant turn. `check_mask` prints and
verifies that alignment on fixed conversations; its negative controls (a mask shifted by one token, a mask
without <|end|>) must fail, and the collator refuses any batch that is all-ignored or all-counted. Training is
plain `transformers.Trainer` + `DataCollatorForSeq2Seq`; the base model's tokenizer is reused, never retrained.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

import torch
from accelerate import PartialState
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, Trainer, TrainingArguments
from transformers.integrations import TensorBoardCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from transformers.trainer_utils import get_last_checkpoint

from hitoban.errors import InputError, OutputExistsError, UsageError
from hitoban.files import read_json, require_file
from hitoban.modeling.loading import check_model_folder
from hitoban.provenance import sha256_file, weights_sha256, write_json, write_lineage
from hitoban.training.data.chat import ChatFilter, read_conversations, read_holdout_pairs
from hitoban.training.device import hf_trainer_precision
from hitoban.training.finetune.lora import save_adapter_and_merged, with_adapter
from hitoban.training.finetune.options import FinetuneOptions
from hitoban.training.trackers import PROJECT, check_available, parse_report_to

CHECK_CONVERSATIONS = [
    [{"role": "user", "content": "こんにちは"}, {"role": "assistant", "content": "こんにちは！今日はどうしましたか？"}],
    [{"role": "user", "content": "1たす1は"}, {"role": "assistant", "content": "2です。"}],
    [{"role": "user", "content": "最近、仕事がとても忙しくて休みの日も疲れが取れません。どうすればいいでしょうか？"},
     {"role": "assistant", "content": "よく眠りましょう。"},
     {"role": "user", "content": "ありがとう"}, {"role": "assistant", "content": "どういたしまして。"}],
]


class MaskError(InputError):
    """The assistant mask is wrong or degenerate; training must not start."""


def build_example(tokenizer, messages: list[dict], max_length: int | None = None, corruption: str | None = None):
    """input_ids + labels for one conversation. `corruption` ("shift" / "drop_end") exists for negative controls."""
    enc = tokenizer.apply_chat_template(messages, return_assistant_tokens_mask=True, return_dict=True)
    ids, mask = list(enc["input_ids"]), list(enc["assistant_masks"])
    if corruption == "shift":
        mask = [0] + mask[:-1]
    elif corruption == "drop_end":
        end = tokenizer.convert_tokens_to_ids("<|end|>")
        mask = [0 if i == end else m for i, m in zip(ids, mask)]
    labels = [i if m else -100 for i, m in zip(ids, mask)]
    if max_length:
        ids, labels = ids[:max_length], labels[:max_length]
    return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels}


def check_mask(tokenizer, conversations=None, corruption: str | None = None, log=print) -> bool:
    """Print counted/ignored text and the first (target, counted) pairs; verify 3LM's invariants."""
    ids_of = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|user|>", "<|assistant|>", "<|end|>")}
    log(f"special ids: {ids_of}")
    failures, counted_total, tokens_total = [], 0, 0
    for n, messages in enumerate(conversations or CHECK_CONVERSATIONS):
        ex = build_example(tokenizer, messages, corruption=corruption)
        ids, labels = ex["input_ids"], ex["labels"]
        counted = [i for i, label in zip(ids, labels) if label != -100]
        log(f"[{n}] counted: {tokenizer.decode(counted)!r}")
        log(f"[{n}] ignored: {tokenizer.decode([i for i, label in zip(ids, labels) if label == -100])!r}")
        pairs = [(tokenizer.decode([t]), labels[k + 1] != -100) for k, t in enumerate(ids[1:])][:8]
        log(f"[{n}] first (target, counted): {pairs}")
        counted_total, tokens_total = counted_total + len(counted), tokens_total + len(ids)
        expect_counted, state = [], False
        for token in ids:  # 3LM's rule: counted from after <|assistant|> through <|end|>
            if token == ids_of["<|assistant|>"]:
                expect_counted.append(False)
                state = True
            elif token == ids_of["<|user|>"]:
                expect_counted.append(False)
                state = False
            else:
                expect_counted.append(state)
                if token == ids_of["<|end|>"]:
                    state = False
        actual = [label != -100 for label in labels]
        if actual != expect_counted:
            first = next(k for k, (a, e) in enumerate(zip(actual, expect_counted)) if a != e)
            failures.append(f"conversation {n}: token {first} ({tokenizer.decode([ids[first]])!r}) is "
                            f"{'counted' if actual[first] else 'ignored'} but should not be")
        if any(label != -100 and i in (ids_of["<|user|>"], ids_of["<|assistant|>"]) for i, label in zip(ids, labels)):
            failures.append(f"conversation {n}: a <|user|>/<|assistant|> marker is counted")
        if any(label == -100 and i == ids_of["<|end|>"] for i, label in zip(ids, labels)):
            failures.append(f"conversation {n}: an <|end|> is not counted (the model would never learn to stop)")
    ratio = counted_total / max(tokens_total, 1)
    if not 0.1 < ratio < 0.95:
        failures.append(f"counted ratio {ratio:.3f} outside (0.1, 0.95)")
    log(f"counted ratio {ratio:.3f}")
    for failure in failures:
        log(f"FAIL: {failure}")
    log("mask check " + ("PASSED" if not failures else "FAILED"))
    return not failures


RECORD = "finetune.json"  # in --out: what this fine-tune is, so that only the same fine-tune resumes there
# Options that may change when a fine-tune resumes (its length, where it runs); every other one must be as recorded.
RESUMABLE_CHANGES = ("epochs", "max_steps", "eval_steps", "skip_bad", "report_to", "cpu")


def fine_tune_record(options: FinetuneOptions) -> dict:
    """What tells this fine-tune apart: its stage, the base weights, every data and holdout file, its options."""
    fields = {k: v for k, v in dataclasses.asdict(options).items()
              if k not in ("base", "data", "exclude", "out") and k not in RESUMABLE_CHANGES}
    return {"stage": options.stage, "base_weights_sha256": weights_sha256(options.base),
            "data_sha256": [sha256_file(path) for path in options.data],
            "exclude_sha256": [sha256_file(path) for path in options.exclude], **fields}


def tracker_run_name(out: Path, record: dict) -> str:
    """The fine-tune's name in a tracker: its folder and a digest of its record, the same on every resume (which
    must have the same record) and different for another fine-tune in a folder of the same name."""
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:8]
    return f"{out.name}-{digest}"


def check_output(options: FinetuneOptions, record: dict) -> None:
    """--out must be new, or this same fine-tune's folder (then it resumes): never the base model, another run's
    folder or a model someone saved there, which the Trainer would overwrite. Reads only, so that it can run before
    the chat files are read."""
    out, base = Path(options.out), Path(options.base)
    if out.resolve() == base.resolve():
        raise OutputExistsError(f"--out {out} is the base model itself; fine-tuning would overwrite its weights: "
                                "choose a new folder")
    if out.is_file():
        raise OutputExistsError(f"--out {out} is a file; fine-tuning writes a model folder there: choose a new "
                                "folder")
    if out.exists() and any(out.iterdir()):
        if not (out / RECORD).is_file():
            raise OutputExistsError(f"{out} already exists and holds no {options.stage} of this base (no {RECORD}): "
                                    "choose a new --out, or remove the folder to start over")
        saved = read_json(out / RECORD, f"the record of the fine-tune in {out}",
                          made_by=f"hitoban {options.stage}")
        changed = sorted(k for k in record.keys() | saved.keys() if record.get(k) != saved.get(k))
        if changed:
            raise OutputExistsError(f"{out} holds another fine-tune (different {', '.join(changed)}); resuming it "
                                    "with these data and options would mix two runs: choose a new --out, or remove "
                                    "the folder to start over")


def claim_output(options: FinetuneOptions, record: dict) -> None:
    """`check_output`, then mark --out as this fine-tune's folder: called once the data are known good, so that a
    refused run leaves nothing behind."""
    check_output(options, record)
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / RECORD, record)


def claim_once(options: FinetuneOptions, record: dict) -> None:
    """`claim_output` in one process: under DDP (torchrun) every rank runs this function, and two ranks checking
    and writing --out at once could refuse each other's claim; the others wait until it is made (a refused claim
    ends the main process, and torchrun then stops the rest)."""
    state = PartialState()
    if state.is_main_process:
        claim_output(options, record)
    state.wait_for_everyone()


def last_checkpoint(folder: Path) -> str | None:
    """The Trainer's newest checkpoint in `folder`, by step number (transformers' own `get_last_checkpoint`: sorted
    as text, checkpoint-900 came after checkpoint-1000 and a resume went back 100 steps)."""
    return get_last_checkpoint(str(folder)) if folder.is_dir() else None


class CheckedCollator(DataCollatorForSeq2Seq):
    """Pads input_ids/attention_mask with pad and labels with -100; refuses degenerate batches."""

    def __call__(self, features, return_tensors=None):
        batch = super().__call__(features, return_tensors)
        real = batch["attention_mask"].bool()
        counted = (batch["labels"] != -100) & real
        if not counted.any():
            raise MaskError("a training batch has no counted token: every label is -100 (check the chat template)")
        if counted.sum() == real.sum():
            raise MaskError("a training batch counts every token: the assistant mask is missing (check the template)")
        return batch


def finetune(options: FinetuneOptions, *, save_total_limit: int = 2, resume: bool = True, quiet: bool = False,
             log=print) -> dict:
    """Trainer fine-tune of a `from_pretrained` hitoban folder on chat files (`options`: `FinetuneOptions` for
    `hitoban sft`, `ToneOptions` for `hitoban tone`); writes `out` + `out/summary.json`. With `--lora`, only a PEFT
    adapter trains and `out` is the adapter folder (with `--merge`: the merged model, the adapter in
    `out/adapter`)."""
    started = time.time()
    o, lora = options, options.lora_settings()
    report_to = check_request(o, lora)
    base, out = Path(o.base), Path(o.out)
    record = fine_tune_record(o)
    if PartialState().is_main_process:  # under DDP: another rank's check could see the main one's claim half-made
        check_output(o, record)  # before anything is read or printed
    tok = AutoTokenizer.from_pretrained(base)
    read_info, chat_filter, kept = read_and_filter(o, log)
    claim_once(o, record)  # before anything is written there
    model = AutoModelForCausalLM.from_pretrained(base)
    max_length = model.config.max_position_embeddings
    if lora is not None:
        model = with_adapter(model, lora)
    examples = [build_example(tok, m, max_length) for m in kept]
    train, val = split_examples(examples, o)
    args = training_arguments(o, out, record, report_to, save_total_limit)
    trainer = build_trainer(model, tok, args, train, val, out, o.batch_size, quiet)
    last = last_checkpoint(out / "trainer") if resume else None
    trainer.train(resume_from_checkpoint=last)
    final_eval = trainer.evaluate()
    trainer.model.config.use_cache = True  # the Trainer turns the KV cache off for training; generation wants it
    if lora is None:
        trainer.save_model(str(out))  # the best model (load_best_model_at_end) + tokenizer, from_pretrained-ready
    elif trainer.is_world_process_zero():
        save_adapter_and_merged(trainer.model, tok, out, o.merge)
    history = [h for h in trainer.state.log_history if "eval_loss" in h]
    best = min(history, key=lambda h: h["eval_loss"]) if history else {"eval_loss": final_eval["eval_loss"],
                                                                        "step": trainer.state.global_step}
    tokens = sum(len(e["input_ids"]) for e in examples)
    counted = sum(sum(label != -100 for label in e["labels"]) for e in examples)
    summary = {"stage": o.stage, "base": base.name, "conversations": len(kept), "train_conversations": len(train),
               "val_conversations": len(val), "tokens": tokens, "counted_tokens": counted,
               "counted_ratio": round(counted / tokens, 4), "best_val_loss": best["eval_loss"],
               "best_step": best["step"], "first_val_loss": history[0]["eval_loss"] if history else None,
               "steps": trainer.state.global_step, "lr": o.lr, "epochs": o.epochs, "resumed": last is not None,
               "filters": chat_filter.report(), "read": read_info, "seconds": round(time.time() - started, 1),
               "lora": ({"r": lora.r, "alpha": lora.alpha, "dropout": lora.dropout, "targets": list(lora.targets),
                         "merged": o.merge} if lora is not None else None)}
    write_summary(trainer, o, record, summary, best)
    log(f"{o.stage}: best val loss {best['eval_loss']:.4f} at step {best['step']} "
        f"({summary['counted_ratio']:.1%} of tokens counted) -> {out}")
    return summary


def check_request(o: FinetuneOptions, lora) -> list[str]:
    """Refuse a fine-tune that cannot work before anything is read or written (the Trainer would fail on a missing
    tracker only once built, after the data were read and --out claimed); returns the trackers to report to."""
    if o.merge and lora is None:
        raise UsageError("--merge merges a LoRA adapter: add --lora")
    report_to = parse_report_to(o.report_to)
    check_available(report_to)
    base = Path(o.base)
    if not (base / "tokenizer.json").exists() or not (base / "chat_template.jinja").exists():
        raise MaskError(f"{base}: the base folder needs its tokenizer and chat template (tokenizer.json, "
                        "chat_template.jinja); fine-tuning never retrains the tokenizer")
    check_model_folder(base, chat_template=True)  # the one model-folder check, before transformers reads it
    for path in o.data:  # before the record hashes them
        require_file(path, "chat data given to --data")
    for path in o.exclude:
        require_file(path, "held-out chats given to --exclude")
    return report_to


def read_and_filter(o: FinetuneOptions, log=print) -> tuple[dict, ChatFilter, list]:
    """Read the chat files and keep the conversations the filters let through (never one that is in a holdout
    file): returns the read counts, the filter (for its report) and what was kept, refusing fewer than two (one
    for training, one for validation)."""
    conversations, read_info = read_conversations([Path(path) for path in o.data], o.skip_bad)
    holdout = [pair for path in o.exclude for pair in read_holdout_pairs(path)]
    chat_filter = ChatFilter(o.filters(), holdout)
    kept = chat_filter.apply(conversations)
    log(f"{o.stage}: {len(conversations)} conversations read ({read_info['bad_lines']} bad lines skipped), "
        f"{len(kept)} kept; rejected {dict(chat_filter.rejected)}")
    if len(kept) < 2:
        raise MaskError(f"only {len(kept)} conversations survive the filters; nothing to train on")
    return read_info, chat_filter, kept


def split_examples(examples: list[dict], o: FinetuneOptions):
    """Training and validation datasets: a `val_frac` share (at least one) drawn by `seed`, so that a resume or a
    rerun validates on the same conversations."""
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(o.seed)).tolist()
    n_val = max(1, int(len(examples) * o.val_frac))
    val = Dataset.from_list([examples[i] for i in order[:n_val]])
    train = Dataset.from_list([examples[i] for i in order[n_val:]])
    return train, val


def training_arguments(o: FinetuneOptions, out: Path, record: dict, report_to: list[str], save_total_limit: int):
    """The Trainer's settings: cosine schedule, evaluation and a checkpoint every `eval_steps`, the best model by
    validation loss kept at the end, the tracker run named after the fine-tune (the same on every resume)."""
    return TrainingArguments(
        output_dir=str(out / "trainer"), learning_rate=o.lr, num_train_epochs=o.epochs, max_steps=o.max_steps,
        per_device_train_batch_size=o.batch_size, per_device_eval_batch_size=o.batch_size,
        gradient_accumulation_steps=o.grad_accum, warmup_steps=o.warmup_ratio, lr_scheduler_type="cosine",
        weight_decay=0.1, max_grad_norm=1.0, eval_strategy="steps", eval_steps=o.eval_steps, save_strategy="steps",
        save_steps=o.eval_steps, save_total_limit=save_total_limit, load_best_model_at_end=True,
        metric_for_best_model="eval_loss", greater_is_better=False, seed=o.seed, data_seed=o.seed,
        **hf_trainer_precision(o.cpu, o.precision), report_to=report_to or "none", project=PROJECT,
        run_name=tracker_run_name(out, record),
        logging_steps=max(1, o.eval_steps // 4), remove_unused_columns=True, disable_tqdm=None)


def build_trainer(model, tok, args, train, val, out: Path, batch_size: int, quiet: bool):
    """The Trainer with the checked collator, which sees one batch first so that a degenerate mask is refused
    before training starts; TensorBoard logs go to one folder per --out (a resume continues its run)."""
    collator = CheckedCollator(tok, label_pad_token_id=-100, pad_to_multiple_of=8)
    collator([train[i] for i in range(min(batch_size, len(train)))])  # refuse a degenerate mask before training
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val, data_collator=collator,
                      processing_class=tok)
    for callback in trainer.callback_handler.callbacks:  # one TensorBoard run per --out, continued by a resume
        if isinstance(callback, TensorBoardCallback):
            callback.logging_dir = str(out / "tensorboard")
    if quiet:  # the demo prints one line per stage: drop the Trainer's progress bar and per-log dict printing

        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
    return trainer


def write_summary(trainer, o: FinetuneOptions, record: dict, summary: dict, best: dict) -> None:
    """Name every data file (by name and sha256) in the summary, then, in one process only (under DDP every rank
    gets here), write the lineage and `summary.json`, which records the weights' sha256 the lineage computed."""
    data_files = [{"name": Path(path).name, "sha256": sha} for path, sha in zip(o.data, record["data_sha256"])]
    summary.update({"kind": f"{o.stage}-summary", "schema": 1, "data": data_files})
    if trainer.is_world_process_zero():
        lineage = write_lineage(Path(o.out), o.stage, Path(o.base), conversations=summary["conversations"],
                                best_val_loss=best["eval_loss"], best_step=best["step"], data=data_files)
        summary.update({"weights_sha256": lineage["weights_sha256"],
                        "base_weights_sha256": lineage["base"]["weights_sha256"]})
        write_json(Path(o.out) / "summary.json", summary)
