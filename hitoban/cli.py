"""`hitoban <verb>`: one command, thin verbs over library functions (each verb's function is what tests call)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from hitoban.errors import ExitCode, HitobanError, UsageError

VERBS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def verb(name: str, help: str):
    """Register `add_arguments` + `run` for a verb; `run` returns the exit code."""

    def decorate(add_arguments):
        def register(run):
            VERBS[name] = (help, add_arguments, run)
            return run

        return register

    return decorate


def print_json(result: dict) -> None:
    print(json.dumps(result, ensure_ascii=False, indent=2))


def _doctor_args(p):
    p.add_argument("--out", default="hitoban-doctor", help="folder for the tokenizer, model and doctor.json")
    p.add_argument("--steps", type=int, default=200, help="training steps (loss must fall)")
    p.add_argument("--seed", type=int, default=0, help="seed for the tiny model and its batches")


@verb("doctor", "check the install: train a tiny model on built-in text, generate, save, reload")(_doctor_args)
def _doctor(args) -> int:
    from hitoban.doctor import run_doctor

    report = run_doctor(args.out, steps=args.steps, seed=args.seed)
    print(f"hitoban doctor: OK in {report['seconds']} s (report: {args.out}/doctor.json)")
    return 0


def _export_args(p):
    p.add_argument("src", help="a hitoban from_pretrained folder")
    p.add_argument("dst", help="new folder for the LlamaForCausalLM export")


@verb("export-llama", "write a LlamaForCausalLM folder equal to a hitoban model (no remote code needed)")(_export_args)
def _export(args) -> int:
    from hitoban.modeling.export_llama import export_llama

    print_json(export_llama(args.src, args.dst))
    return 0


def _export_gguf_args(p):
    p.add_argument("src", help="a hitoban from_pretrained folder (a run's final/, an sft or tone output)")
    p.add_argument("out", help="the .gguf file to write (an Ollama Modelfile is written beside it)")
    p.add_argument("--outtype", choices=("f32", "f16", "q8_0"), default="f32",  # export_gguf.OUTTYPES (no torch here)
                   help="weight type: f32 (exact), f16, or q8_0 (8-bit, about a quarter of f32; norms stay f32). "
                        "Default: f32")
    p.add_argument("--verify", action="store_true",
                   help="run the file in llama.cpp (needs pip install 'hitoban[llama]'); exit 1 unless it tokenizes "
                        "as transformers and gives the same greedy tokens (20 for f32, 10 f16, 5 q8_0). Default: off")


@verb("export-gguf", "write a GGUF file for llama.cpp / Ollama (Llama architecture, SentencePiece vocabulary)")(
    _export_gguf_args)
def _export_gguf(args) -> int:
    from hitoban.modeling.export_gguf import export_gguf

    print_json(export_gguf(args.src, args.out, args.outtype, verify=args.verify))
    return 0


def _import_args(p):
    p.add_argument("src", help="3LM-MLX folder (model.safetensors + config.json) or zxell .pt checkpoint")
    p.add_argument("dst", help="new hitoban from_pretrained folder")
    p.add_argument("--format", choices=["3lm", "zxell"], help="source format (detected from the files when omitted)")


@verb("import", "convert a 3LM-MLX or zxell checkpoint into a hitoban folder")(_import_args)
def _import(args) -> int:
    from hitoban.training.import_checkpoint import import_checkpoint

    print_json(import_checkpoint(args.src, args.dst, args.format))
    return 0


def _kvcache_args(p):
    p.add_argument("--model", help="a from_pretrained folder (default: a random tiny model)")
    p.add_argument("--steps", type=int, default=12, help="decoding steps compared")
    p.add_argument("--atol", type=float, default=1e-5, help="largest allowed |cached - recomputed| logit")
    p.add_argument("--break-rope-offset", action="store_true",
                   help="negative control: feed new tokens at position 0; the check must then FAIL")


@verb("check-kvcache", "cached decoding vs full recomputation (fp32, max |diff| <= 1e-5)")(_kvcache_args)
def _kvcache(args) -> int:
    from hitoban.evaluation.kvcache import check_kvcache

    model = None
    if args.model:
        from transformers import AutoModelForCausalLM

        import hitoban.modeling  # noqa: F401  (registers the Auto classes)
        from hitoban.modeling.loading import device_for

        model = AutoModelForCausalLM.from_pretrained(args.model).to(device_for())
    result = check_kvcache(model, steps=args.steps, atol=args.atol, break_rope_offset=args.break_rope_offset)
    verdict = "PASS" if result["passed"] else "FAIL"
    print(f"kv-cache check {verdict}: max |diff| {result['max_abs_diff']:.3e}, mean {result['mean_abs_diff']:.3e} "
          f"over {result['positions_checked']} positions (limit {args.atol:g})")
    return 0 if result["passed"] else 1


def _parse_pairs(items: list[str] | None, kind=float) -> dict:
    """NAME=VALUE pairs from repeated flags (`--share aozora=0.1`)."""
    pairs = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"expected NAME=VALUE, got {item!r}")
        pairs[name] = kind(float(value)) if kind is int else kind(value)
    return pairs


def _corpus_args(p):
    p.add_argument("--input", nargs="+", default=[], metavar="PATH",
                   help="local .txt (one document per line; a directory of .txt = one document per file), "
                        ".jsonl or .parquet files, directories or globs")
    p.add_argument("--source", action="append", default=[], choices=["fineweb2-ja", "aozora"],
                   help="Hub source streamed at a pinned revision (needs network); repeat for several")
    p.add_argument("--out", required=True, help="new corpus folder (documents.jsonl + manifest.json)")
    p.add_argument("--name", help="domain name for the local input (default: its file or folder name)")
    p.add_argument("--license", default="unknown (local files)", help="licence of the local input, for the manifest")
    p.add_argument("--doc-per-file", action="store_true", help="each .txt file is one document")
    p.add_argument("--blank-line-docs", action="store_true",
                   help="in .txt files, documents are separated by blank lines (default: one per line)")
    p.add_argument("--text-field", default="text", help="field holding the text in .jsonl/.parquet")
    p.add_argument("--encoding", default="utf-8", help="text encoding of the local input")
    p.add_argument("--errors", default="strict", choices=["strict", "replace", "ignore"],
                   help="what to do with undecodable bytes (default: stop and name the file and offset)")
    p.add_argument("--target-chars", type=float, help="stop after this many characters (default: everything)")
    p.add_argument("--share", action="append", metavar="NAME=FRACTION",
                   help="share of the target per source (default aozora=0.10 when mixed, the rest split evenly)")
    p.add_argument("--min-chars", type=int, default=200, help="shorter documents are rejected (3LM)")
    p.add_argument("--max-chars", type=int, default=20_000, help="longer documents are truncated")
    p.add_argument("--min-ja-ratio", type=float, default=0.70,
                   help="documents with a smaller share of Japanese characters are rejected (3LM)")
    p.add_argument("--near-dup", type=float, default=0.85,
                   help="MinHash-LSH Jaccard threshold for near-duplicates (0 turns it off)")
    p.add_argument("--keep-newlines", action="store_true", help="keep line breaks (3LM joins lines with spaces)")
    p.add_argument("--no-pii-mask", action="store_true", help="do not mask e-mails / phone numbers (not advised)")
    p.add_argument("--seed", type=int, default=1234, help="seed for sampling Hub sources")


@verb("corpus", "build a filtered, PII-masked, licence-tracked corpus from local files or pinned Hub datasets")(
    _corpus_args)
def _corpus(args) -> int:
    from hitoban.training.corpus import build_corpus, hub_source, local_source
    from hitoban.training.filters import FilterSettings

    sources = [hub_source(name) for name in args.source]
    if args.input:
        sources.append(local_source(args.input, name=args.name, license=args.license, text_field=args.text_field,
                                    doc_per_file=args.doc_per_file, blank_line_docs=args.blank_line_docs,
                                    encoding=args.encoding, errors=args.errors))
    settings = FilterSettings(min_chars=args.min_chars, max_chars=args.max_chars, min_japanese_ratio=args.min_ja_ratio,
                              near_dup_threshold=args.near_dup or None, keep_newlines=args.keep_newlines)
    target = int(args.target_chars) if args.target_chars else None
    manifest = build_corpus(sources, args.out, target, _parse_pairs(args.share), settings,
                            mask_pii=not args.no_pii_mask, seed=args.seed)
    print(f"corpus: {manifest['total_documents']:,} documents, {manifest['total_chars']:,} chars in "
          f"{manifest['elapsed_seconds']} s; rejected {manifest['filters']['rejected']}; "
          f"PII masked {manifest['pii_masks']} -> {args.out}")
    return 0


def _tokenizer_args(p):
    p.add_argument("--corpus", required=True, help="a folder built by `hitoban corpus`")
    p.add_argument("--out", required=True, help="new tokenizer folder (AutoTokenizer.from_pretrained loads it)")
    p.add_argument("--vocab-size", type=int, default=32000, help="pieces, including special and byte pieces")
    p.add_argument("--max-chars", type=float, default=300e6, help="character budget of the training sample")
    p.add_argument("--source-cap", action="append", metavar="NAME=CHARS",
                   help="at most CHARS sample characters from one source (zxell's per-language caps)")
    p.add_argument("--context", type=int, default=512, help="model_max_length recorded in the tokenizer")
    p.add_argument("--seed", type=int, default=1234, help="seed for the training sample and SentencePiece")


@verb("tokenizer", "train a Unigram tokenizer (SentencePiece trainer, tokenizers runtime) with a chat template")(
    _tokenizer_args)
def _tokenizer(args) -> int:
    from hitoban.training.tokenizer import train_tokenizer_from_corpus

    meta = train_tokenizer_from_corpus(args.corpus, args.out, args.vocab_size, int(args.max_chars),
                                       _parse_pairs(args.source_cap, int), args.seed, args.context)
    print(f"tokenizer: {meta['vocab_size']:,} pieces from {meta['sample']['chars']:,} sample chars; "
          f"held-out chars/token {meta['heldout']['chars_per_token']} -> {args.out}")
    return 0


def _shards_args(p):
    p.add_argument("--corpus", help="a folder built by `hitoban corpus`")
    p.add_argument("--tokenizer", help="a tokenizer folder (with --verify: also check the shards use it)")
    p.add_argument("--out", help="new shard folder")
    p.add_argument("--verify", metavar="SHARDS", help="re-hash and check every invariant of SHARDS, then exit")
    p.add_argument("--shard-tokens", type=int, default=50_000_000, help="tokens per train shard file")
    p.add_argument("--val-every", type=int, default=400, help="per source, document k%%N==0 -> val, ==1 -> test")
    p.add_argument("--max-heldout-docs", type=int, default=2000, help="cap on val (and on test) documents")
    p.add_argument("--context", type=int, default=512, help="refuse a train split shorter than one window")
    p.add_argument("--dtype", choices=["uint16", "uint32"], help="default: uint16 when the vocab fits")
    p.add_argument("--seed", type=int, default=1234, help="recorded in the index (the split rule is by position)")


@verb("shards", "tokenize a corpus into verified zxell-format shards, or --verify a shard folder")(_shards_args)
def _shards(args) -> int:
    from hitoban.training.shards import build_shards, verify_shards

    if args.verify:
        result = verify_shards(args.verify, args.tokenizer, full=True, progress=True)
        print(f"shards OK: {result['shards']} files, tokens {result['splits']}")
        return 0
    if not (args.corpus and args.tokenizer and args.out):
        raise UsageError("give --corpus, --tokenizer and --out (or --verify SHARDS)")
    index = build_shards(args.corpus, args.tokenizer, args.out, args.shard_tokens, args.seed, args.val_every,
                         args.max_heldout_docs, args.context, args.dtype)
    verify_shards(args.out, args.tokenizer)
    splits = ", ".join(f"{name} {s['tokens']:,} tokens / {s['docs']:,} docs" for name, s in index["splits"].items())
    print(f"shards: {splits} ({index['dtype']}, verified) in {index['elapsed_seconds']} s -> {args.out}")
    return 0


def _pretrain_args(p):
    from hitoban.training.options import PretrainConfig, add_options

    add_options(p, PretrainConfig)
    p.add_argument("--supervise", action="store_true",
                   help="relaunch after a crash while the saved step advances; keep the machine awake")
    p.add_argument("--max-restarts", type=int, default=40, help="--supervise: give up after this many relaunches")


@verb("pretrain", "pretrain on shards with crash-safe A/B checkpoints and exact resume (Accelerate)")(_pretrain_args)
def _pretrain(args) -> int:
    from hitoban.training.options import PretrainConfig, from_args
    from hitoban.training.pretrain import pretrain

    if args.supervise:
        from hitoban.training.supervise import supervise

        argv = [a for a in args.argv if a != "--supervise"]
        return supervise(argv, Path(args.out), args.max_restarts)
    cfg = from_args(PretrainConfig, args)
    try:
        pretrain(cfg)
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():  # tear gloo/NCCL down before exit (else: abort at exit)
            dist.destroy_process_group()
    return 0


def _killtest_args(p):
    from hitoban.training.options import TrainingOptions, add_options

    add_options(p, TrainingOptions)
    p.add_argument("--work", default="hitoban-killtest", help="scratch folder; killtest.json and .png land here")
    p.add_argument("--steps", type=int, default=60, help="length of each run (the night's other options are kept)")
    p.add_argument("--kills", type=int, default=2, help="SIGKILLs (the first lands inside a checkpoint save)")
    p.add_argument("--eval-every", type=int, help="validation every N steps (default: at the end only)")


@verb("killtest", "SIGKILL a real run of the night's configuration twice (once mid-save), resume, compare with an "
                  "uninterrupted run")(_killtest_args)
def _killtest(args) -> int:
    from hitoban.evaluation.plots import plot_killtest
    from hitoban.training.killtest import run_killtest
    from hitoban.training.options import TrainingOptions, from_args, to_argv

    options = to_argv(from_args(TrainingOptions, args))
    options += ["--eval-every", str(args.eval_every)] if args.eval_every else []
    result = run_killtest(args.data, args.work, options, steps=args.steps, kills=args.kills)
    plot_killtest(result, Path(args.work) / "killtest.png")
    failed = [name for name, ok in result["checks"].items() if not ok]
    print(f"kill test {'PASSED' if result['passed'] else 'FAILED: ' + ', '.join(failed)} ({result['mode']}, "
          f"{result['seconds']} s) -> {args.work}/killtest.json, killtest.png")
    return 0 if result["passed"] else int(ExitCode.CHECK_FAILED)


def _watch_args(p):
    p.add_argument("run", help="a pretraining run folder")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between refreshes")
    p.add_argument("--once", action="store_true", help="print once and exit")


@verb("watch", "show a run's progress, ETA and health from its heartbeat")(_watch_args)
def _watch(args) -> int:
    from hitoban.training.watch import watch

    watch(args.run, args.interval, args.once)
    return 0


def _calibrate_args(p):
    from hitoban.training.options import TrainingOptions, add_options

    add_options(p, TrainingOptions, only=("data", "context", "precision", "cpu"), optional=("data",))
    p.add_argument("--hours", type=float, default=8.0, help="length of the night")
    p.add_argument("--candidate", action="append", metavar="PRESET:BATCH",
                   help="repeatable; default: tiny:8 small:16 3lm:24 3lm:32 3lm:48 zxell-s:16")
    p.add_argument("--vocab-size", type=int, default=32000, help="vocabulary without --data (with it: the shards')")
    p.add_argument("--steps", type=int, default=10,
                   help="timed steps per candidate at least (after --warmup); more, up to a minute, until the "
                        "timings settle within 10%%")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (allocation, kernel selection)")
    p.add_argument("--compile", choices=["on", "off"], default="off",
                   help="measure the compiled step (compile time excluded, as --hours does)")
    p.add_argument("--out", help="also write the table as JSON")


@verb("calibrate", "measure tok/s per model/batch and pick the run closest to D/N = 20 for the night")(
    _calibrate_args)
def _calibrate(args) -> int:
    from hitoban.training.calibrate import DEFAULT_CANDIDATES, calibrate

    print(f"{'candidate':<16}{'params':>8}{'non-emb':>9}{'tok/s':>17}{'memory':>10}{'tokens':>22}{'D/N':>11}")
    result = calibrate(args.candidate or DEFAULT_CANDIDATES, args.hours, args.data, args.vocab_size, args.context,
                       args.steps, args.warmup, args.cpu, args.precision, args.compile, out=args.out)
    print(f"selected {result['selected']} (D/N closest to 20): {result['sureness']}; run:\n  {result['command']}")
    return 0


def _eval_args(p):
    p.add_argument("kind", choices=["bpc", "gen"],
                   help="bpc: bits per character (3LM's definition); gen: 3LM generation metrics on fixed questions")
    p.add_argument("models", nargs="+", metavar="MODEL", help="from_pretrained folders (with tokenizer)")
    p.add_argument("--domain", action="append", default=[], metavar="NAME=PATH", help="a text file per domain")
    p.add_argument("--shards", help="also report per-domain bits/char on this shard set's val split")
    p.add_argument("--max-chars", type=int, default=400_000, help="use the first N chars of each domain (0 = all)")
    p.add_argument("--questions", help="gen: questions JSONL (id, category, turns, keywords)")
    p.add_argument("--compare", metavar="PREVIOUS.json", help="gen: print deltas against an earlier result")
    p.add_argument("--out", help="JSON result (default bpc.json / gen.json); bpc also writes .md and .png beside it")


@verb("eval", "evaluate models: cross-domain bits/char table (JSON + Markdown + PNG)")(_eval_args)
def _eval(args) -> int:
    from hitoban.evaluation.bpc import cross_domain, write_outputs

    if args.kind == "gen":
        return _eval_gen(args)
    args.out = args.out or "bpc.json"
    domains = _parse_pairs(args.domain, str)
    if not domains and not args.shards:
        raise UsageError("give at least one --domain NAME=PATH (or --shards SHARDS)")
    result = cross_domain(args.models, domains, args.max_chars or None, shards=args.shards)
    paths = write_outputs(result, args.out)
    print(Path(paths[1]).read_text(encoding="utf-8"))
    print("written: " + ", ".join(str(p) for p in paths))
    return 0


def _eval_gen(args) -> int:
    from hitoban.evaluation.generation import compare, evaluate_generation

    if not args.questions:
        raise UsageError("eval gen needs --questions FILE (e.g. ../shared/corpus/3lm-eval/questions.jsonl)")

    def show(item, text):
        print(f"[{item['id']}] {item['turns'][-1]} -> {text[:60]!r}", flush=True)

    out = Path(args.out or "gen.json")
    result = evaluate_generation(args.models[0], args.questions, out, progress=show)
    print(f"repetition {result['repetition_rate']}  topic {result['topic_rate']}  broken {result['broken_rate']}  "
          f"avg len {result['avg_reply_len']} -> {out}")
    if args.compare:
        for line in compare(result, json.loads(Path(args.compare).read_text(encoding="utf-8"))):
            print(line)
    return 0


def _compare_args(p):
    p.add_argument("models", nargs="+", metavar="MODEL", help="from_pretrained folders (with tokenizer)")
    p.add_argument("--out", default="compare", help="folder for compare.json and compare.png")
    p.add_argument("--max-new-tokens", type=int, default=90, help="tokens generated per reply")
    p.add_argument("--seed", type=int, default=777, help="prompt i is sampled with seed + i in every model")


@verb("compare", "same prompts, same seeds through several models (chat + raw continuation): JSON + PNG")(
    _compare_args)
def _compare(args) -> int:
    from hitoban.evaluation.compare import compare_models, write_comparison

    result = compare_models(args.models, max_new_tokens=args.max_new_tokens, seed=args.seed)
    for record in result["records"]:
        print(f"[{record['model']} · {record['mode']}] {record['prompt']} -> {record['reply'][:70]!r}")
    print("written: " + ", ".join(str(p) for p in write_comparison(result, args.out)))
    return 0


def _plot_args(p):
    p.add_argument("run", help="a pretraining run folder (log.jsonl; killtest.json if present)")
    p.add_argument("--out", help="folder for the PNGs (default RUN/plots)")


@verb("plot", "loss curves (train, val, per-domain val, resumes) and the kill-test figure as PNG")(_plot_args)
def _plot(args) -> int:
    from hitoban.evaluation.plots import plot_run

    print("written: " + ", ".join(str(p) for p in plot_run(args.run, args.out)))
    return 0


def _check_mask_args(p):
    p.add_argument("--tokenizer", required=True, help="a tokenizer (or model) folder with the chat template")
    p.add_argument("--control", choices=["shift", "drop_end"],
                   help="negative control: corrupt the mask on purpose; the check must then FAIL")


@verb("check-mask", "print and verify the assistant-only loss mask on fixed conversations")(_check_mask_args)
def _check_mask(args) -> int:
    from transformers import AutoTokenizer

    from hitoban.training.sft import check_mask

    return 0 if check_mask(AutoTokenizer.from_pretrained(args.tokenizer), corruption=args.control) else 1


def _finetune_args(defaults: dict):
    def add(p):
        from hitoban.training.lora import LoraSettings

        p.add_argument("base", help="a from_pretrained hitoban folder (its tokenizer is reused)")
        p.add_argument("--data", nargs="+", required=True, help="chat files: .jsonl (messages or user/assistant), "
                                                                 ".tsv (user<TAB>assistant), .txt (3LM line format)")
        p.add_argument("--out", required=True, help="new from_pretrained folder (+ summary.json, trainer/)")
        p.add_argument("--lr", type=float, default=defaults["lr"], help="peak learning rate (cosine schedule)")
        p.add_argument("--epochs", type=float, default=defaults["epochs"], help="passes over the training chats")
        p.add_argument("--max-steps", type=int, default=defaults["max_steps"], help="overrides --epochs when > 0")
        p.add_argument("--batch-size", type=int, default=32, help="conversations per device step")
        p.add_argument("--grad-accum", type=int, default=1, help="device steps per optimizer step")
        p.add_argument("--warmup-ratio", type=float, default=0.03, help="share of the steps spent warming up")
        p.add_argument("--val-frac", type=float, default=0.01, help="share of the chats held out for validation")
        p.add_argument("--eval-steps", type=int, default=defaults["eval_steps"],
                       help="validate (and keep the best checkpoint) every N steps")
        p.add_argument("--exclude", nargs="*", default=[], metavar="HOLDOUT",
                       help="drop pairs matching, or sharing a 40-char window with, these held-out chats")
        p.add_argument("--min-char-freq", type=int, default=defaults["min_char_freq"],
                       help="drop chats with a character rarer than this in the data (3LM: broken text)")
        p.add_argument("--max-user-chars", type=int, default=100, help="longer user turns are dropped (3LM)")
        p.add_argument("--max-assistant-chars", type=int, default=300, help="longer replies are dropped (3LM)")
        p.add_argument("--skip-bad", action="store_true", help="skip malformed lines (counted) instead of stopping")
        p.add_argument("--seed", type=int, default=1234, help="split, shuffling and initialisation of new weights")
        p.add_argument("--lora", action="store_true",
                       help="train a PEFT LoRA adapter instead of every weight; --out becomes the adapter folder "
                            "(AutoPeftModelForCausalLM)")
        p.add_argument("--lora-r", type=int, default=LoraSettings.r, help="--lora: adapter rank")
        p.add_argument("--lora-alpha", type=int, default=LoraSettings.alpha,
                       help="--lora: scaling numerator (alpha / r)")
        p.add_argument("--lora-targets", default=",".join(LoraSettings.targets),
                       help="--lora: module names (hitoban fuses q/k/v into qkv_proj, gate/up into gate_up_proj)")
        p.add_argument("--merge", action="store_true",
                       help="--lora: write the merged model to --out and the adapter to --out/adapter")
    return add


def _run_finetune(args, stage: str) -> int:
    from hitoban.training.chat_data import ChatFilterSettings
    from hitoban.training.lora import LoraSettings
    from hitoban.training.sft import finetune

    filters = ChatFilterSettings(max_user_chars=args.max_user_chars, max_assistant_chars=args.max_assistant_chars,
                                 min_char_freq=args.min_char_freq)
    if args.merge and not args.lora:
        raise UsageError("--merge merges a LoRA adapter: add --lora")
    lora = (LoraSettings(r=args.lora_r, alpha=args.lora_alpha,
                         targets=tuple(t.strip() for t in args.lora_targets.split(",") if t.strip()))
            if args.lora else None)
    finetune(args.base, args.data, args.out, lr=args.lr, epochs=args.epochs, max_steps=args.max_steps,
             batch_size=args.batch_size, grad_accum=args.grad_accum, warmup_ratio=args.warmup_ratio,
             val_frac=args.val_frac, exclude=args.exclude, seed=args.seed, filters=filters, skip_bad=args.skip_bad,
             eval_steps=args.eval_steps, stage=stage, lora=lora, merge=args.merge)
    return 0


@verb("sft", "chat fine-tune with the HF Trainer, loss on assistant turns only (3LM: lr 1.5e-4, 8 epochs)")(
    _finetune_args({"lr": 1.5e-4, "epochs": 8.0, "max_steps": -1, "eval_steps": 200, "min_char_freq": 10}))
def _sft(args) -> int:
    return _run_finetune(args, "sft")


@verb("tone", "character-tone fine-tune of a chat model (3LM: lr 1e-4, ~30 steps)")(
    _finetune_args({"lr": 1e-4, "epochs": 8.0, "max_steps": 30, "eval_steps": 10, "min_char_freq": 1}))
def _tone(args) -> int:
    return _run_finetune(args, "tone")


def _chat_args(p):
    p.add_argument("model", help="a from_pretrained folder (e.g. RUN/final or an SFT output)")
    p.add_argument("--precision", choices=["auto", "no", "bf16"], default="auto",
                   help="weights in bf16 where the hardware has it (CUDA, AMX / AVX512-BF16 CPUs): about twice the "
                        "tokens per second on a CPU; no: fp32, as saved")


@verb("chat", "chat in the terminal: streaming, history, /reset /temp /topk /penalty /tokens /exit")(_chat_args)
def _chat(args) -> int:
    from hitoban.chat import run_chat

    run_chat(args.model, args.precision)
    return 0


def _leaks_args(p):
    p.add_argument("--holdout", required=True,
                   help="held-out items: a text file (one per line; chat markers split turns) or JSONL chats")
    p.add_argument("--corpus", nargs="+", required=True,
                   help="text files, .jsonl files (their strings are scanned) or `hitoban corpus` folders")
    p.add_argument("--out", help="JSON report")
    p.add_argument("--engine", choices=["sampled-grams", "hyperscan", "ahocorasick-rs"],
                   help="default: sampled-grams (NumPy) for probes of >= 23 bytes, else hyperscan when installed")


@verb("leaks", "exact scan of corpora for held-out text (exit 1 when anything leaks)")(_leaks_args)
def _leaks(args) -> int:
    from hitoban.evaluation.leaks import scan_for_leaks

    def show(row):
        lines = row["affected_holdout_lines"]
        how = ", ".join(f"{k} {len(v)}" for k, v in row["found_by"].items())
        print(f"{row['corpus']}: {row['bytes']:,} bytes, {len(lines)} held-out lines found {lines[:20]}"
              f"{' ...' if len(lines) > 20 else ''}{f' (by {how})' if how else ''} ({row['engine']}, "
              f"{row['mib_per_s']} MiB/s)")

    report = scan_for_leaks(args.holdout, args.corpus, engine=args.engine, progress=show, out=args.out)
    coverage = report["coverage"]
    print(f"{report['holdout']}: {coverage['probed_lines']} of {coverage['lines']} held-out lines probed "
          f"({', '.join(f'{k} {v}' for k, v in coverage['by'].items())}; {report['probes']} probes, "
          f"{report['whole_turns']} whole turns); {coverage['unprobed_lines']} could not be "
          f"({coverage['unprobed'] or 'none'}): {'LEAKED' if report['leaked'] else 'no leak'}")
    return int(ExitCode.CHECK_FAILED) if report["leaked"] else 0


def _pii_args(p):
    p.add_argument("model", nargs="?", help="a from_pretrained folder to attack (omit with --canaries)")
    p.add_argument("--corpus", nargs="+", required=True,
                   help="the training corpus: text files or `hitoban corpus` folders (with --canaries: the small "
                        "corpus to plant fake contacts into)")
    p.add_argument("--samples", type=int, default=60, help="distinct contacts to try (3LM: 60)")
    p.add_argument("--max-new-tokens", type=int, default=40, help="greedy tokens generated per attack (3LM: 40)")
    p.add_argument("--canaries", type=int, metavar="N",
                   help="sensitivity control: plant N fake contacts at --repetitions, train a tiny model on the "
                        "planted copy and one on the clean copy, attack both")
    p.add_argument("--repetitions", default="1,4,16,64", help="comma-separated repetition counts for --canaries")
    p.add_argument("--steps", type=int, default=400, help="--canaries: training steps per tiny model")
    p.add_argument("--seed", type=int, default=0, help="--canaries: seed for the fakes, their placement and models")
    p.add_argument("--out", help="JSON report (masked values only); with --canaries a folder (default pii-canaries)")


@verb("pii", "prefix-attack PII probe (exit 1 on an exact reproduction) and its canary control")(_pii_args)
def _pii(args) -> int:
    from hitoban.evaluation import privacy as pii

    if args.canaries:
        texts = [doc for text in pii.corpus_texts(args.corpus) for doc in text.splitlines() if doc.strip()]
        repetitions = tuple(int(x) for x in args.repetitions.split(","))
        report = pii.canary_control(texts, args.out or "pii-canaries", args.canaries, repetitions, args.steps,
                                    args.seed)
        for name in ("planted_model", "clean_model"):
            rows = ", ".join(f"{r['exact']}/{r['canaries']} exact at {r['repetitions']}x (value NLL "
                             f"{r['mean_value_nll']})" for r in report[name]["by_repetitions"])
            print(f"{name}: {rows}; fresh fakes NLL {report[name]['fresh_value_nll']}")
        print(f"the miner found {report['mining']['mined']} of {report['canaries']} planted canaries; the probe is "
              f"{'SENSITIVE' if report['sensitive'] else 'NOT shown sensitive'}: planted canaries extracted "
              f"{report['planted_model']['exact_total']}, clean model {report['clean_model']['exact_total']}"
              + (f" ({report['reason']})" if report.get("reason") else ""))
        return 0 if report["sensitive"] else 1
    if not args.model:
        raise UsageError("give MODEL to attack (or --canaries N for the sensitivity control)")
    out = Path(args.out or "pii.json")
    report = pii.probe_model(args.model, args.corpus, args.samples, args.max_new_tokens, out=out)
    if report["status"] == pii.NOT_MEASURED:
        print(f"PII probe NOT MEASURED: {report['reason']} -> {out}")
        return int(ExitCode.NOT_MEASURED)
    for row in report["candidates"]:
        if row["result"] != "none":
            print(f"  {row['result']:<8}{row['kind']:<7}{row['masked']}")
    mining = report["mining"]
    print(f"tried {report['tried']} ({mining['from_masked_log']} from the masked-value log, {mining['from_detector']} "
          f"found by the detector), exact {report['exact']}, partial {report['partial']} -> {out}"
          + ("  DO NOT PUBLISH: exact reproductions" if report["exact"] else ""))
    return int(ExitCode.CHECK_FAILED) if report["exact"] else 0


def _secrets_args(p):
    p.add_argument("dir", nargs="?", default=".", help="folder to scan (default: here)")
    p.add_argument("--git", action="store_true", help="also scan every commit of the git history")


@verb("secrets", "scan files (and --git history) for tokens, keys, passwords, home paths (exit 1 on findings)")(
    _secrets_args)
def _secrets(args) -> int:
    from hitoban.release.secrets import scan_all

    report = scan_all(args.dir, git=args.git)
    findings = report.findings
    for line in report.skipped_lines():
        print(line)
    for finding in findings[:80]:
        print(finding)
    if len(findings) > 80:
        print(f"... and {len(findings) - 80} more")
    if findings:
        print(f"{len(findings)} finding(s). Revoke any real key first (rewriting history does not un-leak it), "
              "then remove it from the files and, with --git findings, from the history.")
        return 1
    print(f"no secrets found in {report.scanned} file(s) of {args.dir}{' and its git history' if args.git else ''}")
    return 0


def _card_args(p):
    p.add_argument("model_dir", help="the from_pretrained folder to publish")
    p.add_argument("--repo", required=True, help="OWNER/NAME on the Hub (used in the usage snippet)")
    p.add_argument("--from", dest="search", nargs="*", default=[], metavar="DIR",
                   help="folders to search for artefacts (run, corpus, eval, pii results); the model folder is "
                        "always searched")
    p.add_argument("--out", help="default MODEL_DIR/README.md")


@verb("card", "write the model card (README.md) from the run's artefacts; missing ones say 'not measured'")(
    _card_args)
def _card(args) -> int:
    from hitoban.release.card import write_card

    result = write_card(args.model_dir, args.repo, args.search, args.out)
    print(f"model card -> {result['card']}\n  measured: {', '.join(result['measured'])}\n  not measured: "
          f"{', '.join(result['not_measured']) or 'nothing'}")
    return 0


def _publish_args(p):
    p.add_argument("--dry-run", action="store_true", help="list what would be uploaded and skipped; send nothing")
    visibility = p.add_mutually_exclusive_group()
    visibility.add_argument("--private", dest="private", action="store_true", default=True,
                            help="create the repo private (default)")
    visibility.add_argument("--public", dest="private", action="store_false", help="create the repo public")


def _run_publish(verb_name: str, publish) -> int:
    """Print the result as JSON; a refusal is exit 1 with its reasons on stderr."""
    from hitoban.release.upload import UploadRefused

    try:
        result = publish()
    except UploadRefused as err:
        print(f"hitoban {verb_name}: {err}", file=sys.stderr)
        return 1
    print_json(result)
    return 0


def _upload_args(p):
    p.add_argument("model_dir", help="the from_pretrained folder, with its model card (README.md from `hitoban card`)")
    p.add_argument("--repo", required=True, help="OWNER/NAME")
    _publish_args(p)
    p.add_argument("--create-pr", action="store_true", help="open a pull request instead of pushing to main")
    p.add_argument("--include", nargs="*", default=[], metavar="PATTERN", help="extra allow-list globs")
    p.add_argument("--pii", help="PII probe JSON (default MODEL_DIR/pii.json)")
    p.add_argument("--i-know", metavar="REASON", help="publish despite an exact PII reproduction; REASON is recorded")


@verb("upload", "allow-listed upload to the Hub (refuses on secrets, no card, optimizer/logs, PII leaks)")(
    _upload_args)
def _upload(args) -> int:
    from hitoban.release.upload import upload_model

    return _run_publish("upload", lambda: upload_model(args.model_dir, args.repo, args.dry_run, args.private,
                                                       args.create_pr, args.include, args.pii, args.i_know))


def _space_args(p):
    p.add_argument("--repo", required=True, help="OWNER/NAME of the Space")
    p.add_argument("--model", required=True, help="OWNER/NAME of the model the Space serves")
    _publish_args(p)


@verb("space", "publish the Gradio chat Space (spaces/) for a model on the Hub")(_space_args)
def _space(args) -> int:
    from hitoban.release.upload import publish_space

    return _run_publish("space", lambda: publish_space(args.repo, args.model, args.dry_run, args.private))


def _demo_args(p):
    p.add_argument("--out", default="hitoban-demo", help="new folder for everything the demo makes (+ report.md)")
    p.add_argument("--source", nargs="+", default=["builtin"], metavar="builtin|aozora|fineweb2-ja|PATH",
                   help="pretraining text: the built-in Japanese text (offline, default), a pinned slice of Aozora "
                        "Bunko or FineWeb-2 (network), or your own files")
    p.add_argument("--quick", action="store_true", help="fewer steps everywhere (CI); every stage still runs")
    p.add_argument("--cpu", action="store_true", default=None, help="stay on the CPU even with a GPU/MPS")
    p.add_argument("--seed", type=int, default=0, help="one seed for every stage")
    p.add_argument("--force", action="store_true", help="replace --out if an earlier `hitoban demo` made it")
    p.add_argument("--until", metavar="STAGE", help="stop after this stage (corpus, tokenizer, shards, calibrate, "
                                                    "pretrain, sft, eval, leaks, pii, card, upload)")


@verb("demo", "the whole night in minutes: corpus -> tokenizer -> pretrain (killed + resumed) -> SFT -> eval -> "
              "leak/PII checks -> card -> upload dry run")(_demo_args)
def _demo(args) -> int:
    from hitoban.demo import run_demo

    run_demo(args.out, args.source, args.quick, args.cpu, args.seed, args.until, args.force)
    return 0


PIPELINE = {  # the order a night goes in; `hitoban --help` lists the verbs this way
    "start here": ["demo", "doctor"],
    "data": ["corpus", "tokenizer", "shards"],
    "pretraining": ["calibrate", "killtest", "pretrain", "watch", "plot"],
    "fine-tuning": ["check-mask", "sft", "tone", "chat"],
    "evaluation": ["eval", "compare", "leaks", "pii"],
    "publishing": ["secrets", "card", "upload", "space"],
    "models": ["check-kvcache", "export-llama", "export-gguf", "import"],
}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option shows its default, unless it has none worth showing or its help already says it."""

    def _get_help_string(self, action):
        help_text = action.help or ""
        switch = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        if switch or action.default is None or action.default == argparse.SUPPRESS or "default" in help_text:
            return help_text
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    from hitoban import __version__

    ordered = [name for names in PIPELINE.values() for name in names]
    assert sorted(ordered) == sorted(VERBS), f"verbs missing from PIPELINE: {set(VERBS) ^ set(ordered)}"
    width = max(map(len, ordered))
    listing = "\n".join(f"{group}:\n" + "\n".join(f"  {name:<{width}}  {VERBS[name][0]}" for name in names)
                        for group, names in PIPELINE.items())
    parser = argparse.ArgumentParser(
        prog="hitoban", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a small language model overnight on one GPU or Mac, measure it honestly, publish it.",
        epilog=f"verbs, in the order a night goes:\n{listing}\n\n`hitoban VERB --help` explains each option with "
               "its default.")
    parser.add_argument("--version", action="version", version=f"hitoban {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True, help="one of the verbs below")
    for name in ordered:
        help_text, add_arguments, run = VERBS[name]
        p = sub.add_parser(name, description=help_text, formatter_class=HelpFormatter)
        add_arguments(p)
        p.set_defaults(handler=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # the command as given (`pretrain --supervise` relaunches exactly it)
    try:
        return args.handler(args)
    except HitobanError as err:  # something the user can act on: one line and its named exit code
        print(f"hitoban {args.verb}: error: {err}", file=sys.stderr)
        return int(err.exit_code)
    except KeyboardInterrupt:
        print(f"hitoban {args.verb}: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    # anything else is a bug or an environment failure (CUDA OOM, a torch internal): its traceback is shown


if __name__ == "__main__":
    sys.exit(main())
