"""Model verbs: the KV-cache check, the Llama and GGUF exports and checkpoint import."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from hitoban.errors import ExitCode
from hitoban.evaluation.options import KVCACHE_ATOL, KvcacheOptions
from hitoban.options import add_options, from_args
from hitoban.training.import_options import ImportOptions
from hitoban.verbs import print_json, verb


def modeling_options():
    """`hitoban.modeling.options` without running `hitoban.modeling`'s `__init__`, which registers the model with
    transformers (every verb's parser would then import torch and transformers): the file is loaded as that module,
    unless the package is already imported (then it is imported as usual). Either way one module object holds the
    option dataclasses, so `export_gguf` and the command line share OUTTYPES."""
    name = "hitoban.modeling.options"
    if name in sys.modules or "hitoban.modeling" in sys.modules:
        return importlib.import_module(name)
    folder = importlib.util.find_spec("hitoban.modeling").submodule_search_locations[0]
    spec = importlib.util.spec_from_file_location(name, Path(folder) / "options.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses resolve the module's annotations through it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _export_args(p):
    add_options(p, modeling_options().ExportLlamaOptions)


@verb("export-llama", "write a LlamaForCausalLM folder equal to a hitoban model (no remote code needed)")(_export_args)
def _export(args) -> int:
    options = from_args(modeling_options().ExportLlamaOptions, args)
    from hitoban.modeling.export_llama import export_llama

    print_json(export_llama(options.src, options.dst))
    return 0


def _export_gguf_args(p):
    add_options(p, modeling_options().ExportGgufOptions)


@verb("export-gguf", "write a GGUF file for llama.cpp / Ollama (Llama architecture, llama.cpp's unigram tokenizer)")(
    _export_gguf_args)
def _export_gguf(args) -> int:
    options = from_args(modeling_options().ExportGgufOptions, args)
    from hitoban.modeling.export_gguf import export_gguf

    print_json(export_gguf(options.src, options.out, options.outtype, verify=options.verify))
    return 0


def _import_args(p):
    add_options(p, ImportOptions)


@verb("import", "convert a 3LM-MLX or zxell checkpoint into a hitoban folder")(_import_args)
def _import(args) -> int:
    options = from_args(ImportOptions, args)
    from hitoban.training.import_checkpoint import import_checkpoint

    print_json(import_checkpoint(options.src, options.dst, options.format))
    return 0


def _kvcache_args(p):
    add_options(p, KvcacheOptions)


@verb("check-kvcache", "cached decoding vs full recomputation (fp32, max |diff| <= "
                       f"{KVCACHE_ATOL:g})".replace("e-0", "e-"))(_kvcache_args)
def _kvcache(args) -> int:
    options = from_args(KvcacheOptions, args)
    from hitoban.evaluation.kvcache import check_kvcache

    result = check_kvcache(options.model, steps=options.steps, atol=options.atol,
                           break_rope_offset=options.break_rope_offset)
    verdict = "PASS" if result["passed"] else "FAIL"
    print(f"kv-cache check {verdict}: max |diff| {result['max_abs_diff']:.3e}, mean {result['mean_abs_diff']:.3e} "
          f"over {result['positions_checked']} positions (limit {options.atol:g})")
    return 0 if result["passed"] else int(ExitCode.CHECK_FAILED)
