"""Measurement verbs: bits/char and generation metrics, side-by-side comparison, the leak scan, the PII probe."""

from __future__ import annotations

import json
from pathlib import Path

from hitoban.errors import ExitCode, UsageError
from hitoban.options import add_options, from_args
from hitoban.verbs import parse_pairs, verb


def _eval_args(p):
    from hitoban.evaluation.options import EvalOptions

    add_options(p, EvalOptions)


@verb("eval", "evaluate models: cross-domain bits/char table (JSON + Markdown + PNG)")(_eval_args)
def _eval(args) -> int:
    from hitoban.evaluation.bpc import cross_domain, write_outputs
    from hitoban.evaluation.options import EvalOptions

    options = from_args(EvalOptions, args)  # ranges checked before anything is read
    if options.kind == "gen":
        return _eval_gen(options)
    out = options.out or "bpc.json"
    domains = parse_pairs(options.domain, str)
    if not domains and not options.shards:
        raise UsageError("give at least one --domain NAME=PATH (or --shards SHARDS)")
    result = cross_domain(options.models, domains, options.max_chars or None, shards=options.shards)
    paths = write_outputs(result, out)
    print(Path(paths[1]).read_text(encoding="utf-8"))
    print("written: " + ", ".join(str(p) for p in paths))
    return 0


def _eval_gen(args) -> int:
    from hitoban.evaluation.generation import compare, evaluate_generation

    if not args.questions:
        raise UsageError("eval gen needs --questions FILE (e.g. hitoban/data/builtin_questions.jsonl, the 10 "
                         "questions hitoban demo uses)")

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
    from hitoban.evaluation.options import CompareOptions

    add_options(p, CompareOptions)


@verb("compare", "same prompts, same seeds through several models (chat + raw continuation): JSON + PNG")(
    _compare_args)
def _compare(args) -> int:
    from hitoban.evaluation.options import CompareOptions

    options = from_args(CompareOptions, args)
    from hitoban.evaluation.compare import compare_models, write_comparison

    result = compare_models(options.models, max_new_tokens=options.max_new_tokens, seed=options.seed)
    for record in result["records"]:
        print(f"[{record['model']} · {record['mode']}] {record['prompt']} -> {record['reply'][:70]!r}")
    print("written: " + ", ".join(str(p) for p in write_comparison(result, options.out)))
    return 0


def _leaks_args(p):
    from hitoban.evaluation.options import LeaksOptions

    add_options(p, LeaksOptions)


@verb("leaks", "exact scan of corpora for held-out text (exit 1 when anything leaks)")(_leaks_args)
def _leaks(args) -> int:
    import codecs

    from hitoban.evaluation.options import LeaksOptions

    args = from_args(LeaksOptions, args)
    from hitoban.evaluation.leaks import scan_for_leaks

    try:
        codecs.lookup(args.encoding)
    except LookupError:
        raise UsageError(f"--encoding {args.encoding}: not an encoding Python knows") from None

    def show(row):
        lines = row["affected_holdout_lines"]
        how = ", ".join(f"{k} {len(v)}" for k, v in row["found_by"].items())
        print(f"{row['corpus']}: {row['bytes']:,} bytes ({row['text_bytes']:,} read as {row['encoding']} text), "
              f"{len(lines)} held-out lines found {lines[:20]}"
              f"{' ...' if len(lines) > 20 else ''}{f' (by {how})' if how else ''} ({row['engine']}, "
              f"{row['mib_per_s']} MiB/s)")

    report = scan_for_leaks(args.holdout, args.corpus, engine=args.engine, progress=show, out=args.out,
                            encoding=args.encoding)
    coverage = report["coverage"]
    print(f"{report['holdout']}: {coverage['probed_lines']} of {coverage['lines']} held-out lines probed "
          f"({', '.join(f'{k} {v}' for k, v in coverage['by'].items())}; {report['probes']} probes, "
          f"{report['whole_turns']} whole turns); {coverage['unprobed_lines']} could not be "
          f"({coverage['unprobed'] or 'none'}): {'LEAKED' if report['leaked'] else 'no leak'}")
    if report["leaked"]:
        return int(ExitCode.CHECK_FAILED)
    if not report["complete"]:  # records it could not read were not probed: "no leak" would be a claim about them
        print(f"NOT MEASURED for {coverage['unreadable_lines']} held-out record(s) no chat reader understands (lines "
              f"{coverage['unreadable_examples']}): write them as messages, conversations, prompt/response or text")
        return int(ExitCode.NOT_MEASURED)
    return 0


def _pii_args(p):
    from hitoban.evaluation.options import PiiOptions

    add_options(p, PiiOptions)


@verb("pii", "prefix-attack PII probe (exit 1 on an exact reproduction) and its canary control")(_pii_args)
def _pii(args) -> int:
    from hitoban.evaluation.options import PiiOptions

    args = from_args(PiiOptions, args)
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
        return 0 if report["sensitive"] else int(ExitCode.CHECK_FAILED)
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
