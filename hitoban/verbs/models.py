"""Model verbs: the KV-cache check, the Llama and GGUF exports and checkpoint import."""

from __future__ import annotations

from hitoban.errors import ExitCode
from hitoban.options import ranged
from hitoban.verbs import print_json, verb


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
                   help="weight type: f32 (exact), f16, or q8_0 (8-bit, about a quarter of f32; norms stay f32)")
    p.add_argument("--verify", action="store_true",
                   help="run the file in llama.cpp (needs pip install 'hitoban[llama]'); exit 1 unless it tokenizes "
                        "as transformers and gives the same greedy tokens (20 for f32, 10 f16, 5 q8_0). Default: off")


@verb("export-gguf", "write a GGUF file for llama.cpp / Ollama (Llama architecture, llama.cpp's unigram tokenizer)")(
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
    p.add_argument("--steps", type=ranged(int, min=1), default=12, help="decoding steps compared")
    p.add_argument("--atol", type=ranged(float, above=0), default=1e-5,
                   help="largest allowed |cached - recomputed| logit")
    p.add_argument("--break-rope-offset", action="store_true",
                   help="negative control: feed new tokens at position 0; the check must then FAIL")


@verb("check-kvcache", "cached decoding vs full recomputation (fp32, max |diff| <= 1e-5)")(_kvcache_args)
def _kvcache(args) -> int:
    from hitoban.evaluation.kvcache import check_kvcache

    result = check_kvcache(args.model, steps=args.steps, atol=args.atol, break_rope_offset=args.break_rope_offset)
    verdict = "PASS" if result["passed"] else "FAIL"
    print(f"kv-cache check {verdict}: max |diff| {result['max_abs_diff']:.3e}, mean {result['mean_abs_diff']:.3e} "
          f"over {result['positions_checked']} positions (limit {args.atol:g})")
    return 0 if result["passed"] else int(ExitCode.CHECK_FAILED)
