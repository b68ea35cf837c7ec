"""`hitoban <verb>`: one command, thin verbs over library functions (each verb's function is what tests call)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

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
    p.add_argument("--seed", type=int, default=0)


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


def _import_args(p):
    p.add_argument("src", help="3LM-MLX folder (model.safetensors + config.json) or zxell .pt checkpoint")
    p.add_argument("dst", help="new hitoban from_pretrained folder")
    p.add_argument("--format", choices=["3lm", "zxell"], help="source format (detected from the files when omitted)")


@verb("import", "convert a 3LM-MLX or zxell checkpoint into a hitoban folder")(_import_args)
def _import(args) -> int:
    from hitoban.modeling.import_checkpoint import import_checkpoint

    print_json(import_checkpoint(args.src, args.dst, args.format))
    return 0


def _kvcache_args(p):
    p.add_argument("--model", help="a from_pretrained folder (default: a random tiny model)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--break-rope-offset", action="store_true",
                   help="negative control: feed new tokens at position 0; the check must then FAIL")


@verb("check-kvcache", "cached decoding vs full recomputation (fp32, max |diff| <= 1e-5)")(_kvcache_args)
def _kvcache(args) -> int:
    from hitoban.evaluation.kvcache import check_kvcache

    model = None
    if args.model:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.model)
    result = check_kvcache(model, steps=args.steps, atol=args.atol, break_rope_offset=args.break_rope_offset)
    verdict = "PASS" if result["passed"] else "FAIL"
    print(f"kv-cache check {verdict}: max |diff| {result['max_abs_diff']:.3e}, mean {result['mean_abs_diff']:.3e} "
          f"over {result['positions_checked']} positions (limit {args.atol:g})")
    return 0 if result["passed"] else 1


def build_parser() -> argparse.ArgumentParser:
    from hitoban import __version__

    parser = argparse.ArgumentParser(
        prog="hitoban",
        description="Train a small language model overnight on one GPU or Mac, measure it honestly, publish it.",
    )
    parser.add_argument("--version", action="version", version=f"hitoban {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for name, (help_text, add_arguments, run) in VERBS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as err:
        print(f"hitoban {args.verb}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
