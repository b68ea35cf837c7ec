"""GGUF for llama.cpp and Ollama, written with the `gguf` package (the library llama.cpp's converter uses).

A hitoban model is Llama's function (docs/design.md §2), so the GGUF is a plain `llama` architecture file: the Llama
export's weights under llama.cpp's tensor names, with q/k rows permuted from transformers' rotate-half RoPE layout
into llama.cpp's. The tokenizer needs more care than the weights, because llama.cpp re-implements SentencePiece's
unigram and reads its settings from the file, not from `tokenizer.json`:

- the tokenizer type `t5`: llama.cpp's unigram (Viterbi) tokenizer, the algorithm hitoban's tokenizer uses. Its
  SentencePiece type `llama` is SentencePiece-BPE (merges by score) and segments a unigram vocabulary differently
  (measured: 15 of 50 held-out texts equal). llama.cpp's unigram has no byte fallback: a character outside the
  vocabulary becomes one `<|unk|>` where transformers gives its UTF-8 byte pieces (with a 32k tokenizer: 10 of 220
  held-out chats have such a character);
- the vocabulary with its scores and piece types (byte pieces BYTE, `<|unk|>` UNKNOWN, the chat markers CONTROL, so
  llama.cpp parses them as one token in a chat prompt and hides them in output, as transformers'
  `skip_special_tokens` does);
- `add_space_prefix = false`: hitoban's tokenizer was trained with SentencePiece's `add_dummy_prefix=False`; llama.cpp
  assumes true for SentencePiece vocabularies and would prepend "▁" to every text;
- `add_bos_token = false`: hitoban has no BOS token (llama.cpp would otherwise put id 1, `<|user|>`, first).

The tokenizer's SentencePiece model and the Llama weight names come from `llama_format.py`, shared with the Llama
export.
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from sentencepiece import sentencepiece_model_pb2 as sp_pb2
from transformers import AutoTokenizer

from hitoban.errors import CheckFailed, InputError, OutputExistsError, UsageError
from hitoban.modeling.loading import check_model_folder
from hitoban.modeling.options import GREEDY_TOKENS_EQUAL, OUTTYPES

from .llama_format import (
    BYTE_PIECE,
    TOKENIZER_CHECK_TEXTS,
    llama_cpp_chat_template,
    llama_state_dict,
    sentencepiece_model,
    tokenizer_json,
)
from .modeling_hitoban import HitobanForCausalLM

VERIFY_PROMPT = "<|user|>こんにちは。自己紹介をしてください。<|assistant|>"


def _require(module: str, extra: str, what: str):
    """Import an optional dependency, or say which extra provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise UsageError(f"{what} needs {module}: pip install 'hitoban[{extra}]'") from err


def _chat_template(folder: Path) -> str | None:
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    config = folder / "tokenizer_config.json"
    return json.loads(config.read_text(encoding="utf-8")).get("chat_template") if config.is_file() else None


def _permute_for_rope(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """transformers' rotate-half rows -> llama.cpp's interleaved pairs (convert_hf_to_gguf's `LlamaModel.permute`)."""
    return weight.reshape(n_heads, 2, weight.shape[0] // n_heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def _tensor_data(tensor: np.ndarray, outtype: str):
    """(data, raw ggml type or None): 1-D tensors (norms) stay f32, as llama.cpp's converter keeps them."""
    import gguf  # lazy: an optional extra (hitoban[gguf]); _require says so when missing

    if tensor.ndim == 1 or outtype == "f32":
        return tensor.astype(np.float32), None
    if outtype == "f16":
        return tensor.astype(np.float16), None
    if tensor.shape[-1] % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0]:
        return tensor.astype(np.float16), None  # rows not a multiple of 32 cannot be Q8_0 blocks (converter alike)
    return gguf.quants.quantize(tensor.astype(np.float32), gguf.GGMLQuantizationType.Q8_0), \
        gguf.GGMLQuantizationType.Q8_0


def _write_model_metadata(writer, config, name: str, outtype: str) -> None:
    import gguf  # lazy: an optional extra (hitoban[gguf]); _require says so when missing

    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(float(config.rope_theta))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                          "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype])


def _write_tokenizer_metadata(writer, proto, config, template: str | None) -> None:
    """The vocabulary as llama.cpp's unigram tokenizer, with hitoban's settings (see the module docstring)."""
    import gguf  # lazy: an optional extra (hitoban[gguf]); _require says so when missing

    kinds = gguf.TokenType
    types = {1: kinds.NORMAL, 2: kinds.UNKNOWN, 3: kinds.CONTROL, 4: kinds.USER_DEFINED, 5: kinds.UNUSED,
             6: kinds.BYTE}  # SentencePiece's piece types -> GGUF's
    writer.add_tokenizer_model("t5")  # llama.cpp's unigram (UGM) tokenizer
    writer.add_tokenizer_pre("default")
    writer.add_token_list([p.piece.encode("utf-8") for p in proto.pieces])
    writer.add_token_scores([p.score for p in proto.pieces])
    writer.add_token_types([types[p.type] for p in proto.pieces])
    writer.add_add_space_prefix(False)
    writer.add_remove_extra_whitespaces(False)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_unk_token_id(proto.trainer_spec.unk_id)
    if config.eos_token_id is not None:
        writer.add_eos_token_id(config.eos_token_id)
    if config.pad_token_id is not None:
        writer.add_pad_token_id(config.pad_token_id)
    if template is not None:
        writer.add_chat_template(llama_cpp_chat_template(template))


def _add_tensors(writer, model, outtype: str) -> int:
    """The Llama export's weights under llama.cpp's names, q/k rows permuted; returns how many were added."""
    import gguf  # lazy: an optional extra (hitoban[gguf]); _require says so when missing


    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    added = 0
    for name, tensor in llama_state_dict(model).items():
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
            tensor = _permute_for_rope(tensor, heads)
        gguf_name = names.get_name(name, try_suffixes=(".weight",))
        if gguf_name is None:
            raise CheckFailed(f"no GGUF name for {name}; nothing was written")
        data, raw_type = _tensor_data(tensor.numpy(), outtype)
        writer.add_tensor(gguf_name, data, raw_dtype=raw_type)
        added += 1
    return added


def export_gguf(src: str | os.PathLike, out: str | os.PathLike, outtype: str = OUTTYPES[0],
                verify: bool = False) -> dict:
    """Write `out` (a .gguf file) for llama.cpp from a hitoban model folder; returns what was written.

    `verify` runs the staged file in llama.cpp first (`verify_gguf`); on a failure nothing is written."""
    gguf = _require("gguf", "gguf", "export-gguf")
    if verify:
        _require("llama_cpp", "llama", "export-gguf --verify")


    src, out = Path(src), Path(out)
    if outtype not in OUTTYPES:
        raise InputError(f"--outtype must be one of {', '.join(OUTTYPES)}, got {outtype!r}")
    if out.exists():
        raise OutputExistsError(f"{out} already exists; choose a new file")
    check_model_folder(src)  # the one model-folder check: config, whole weights, tokenizer files
    proto = sp_pb2.ModelProto.FromString(sentencepiece_model(src))
    model = HitobanForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    if len(proto.pieces) != model.config.vocab_size:
        raise InputError(f"{src}: the tokenizer has {len(proto.pieces)} pieces but the model "
                         f"{model.config.vocab_size} rows")
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, staged = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(handle)
    try:
        writer = gguf.GGUFWriter(staged, "llama")
        _write_model_metadata(writer, model.config, src.name, outtype)
        _write_tokenizer_metadata(writer, proto, model.config, _chat_template(src))
        written = _add_tensors(writer, model, outtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        checked = verify_gguf(staged, src, outtype) if verify else None
        os.replace(staged, out)
    finally:
        if os.path.exists(staged):
            os.unlink(staged)
    modelfile = out.with_suffix(".Modelfile")
    modelfile.write_text(ollama_modelfile(out.name), encoding="utf-8")
    report = {"out": out.name, "outtype": outtype, "bytes": out.stat().st_size, "vocab_size": len(proto.pieces),
              "tensors": written, "modelfile": modelfile.name}
    if checked is not None:
        report["llama_cpp"] = {k: v for k, v in checked.items() if not k.startswith("greedy_") or "prefix" in k}
    return report


def ollama_modelfile(gguf_name: str) -> str:
    """An Ollama Modelfile for the GGUF: hitoban's chat format as an Ollama (Go) template, stopping at <|end|>."""
    return (
        f"# ollama create my-hitoban -f {Path(gguf_name).with_suffix('.Modelfile').name}; ollama run my-hitoban\n"
        f"FROM ./{gguf_name}\n"
        'TEMPLATE """{{- range .Messages }}{{- if eq .Role "user" }}<|user|>{{ .Content }}'
        '{{- else if eq .Role "assistant" }}<|assistant|>{{ .Content }}<|end|>{{- end }}{{- end }}<|assistant|>"""\n'
        'PARAMETER stop "<|end|>"\n'
        'PARAMETER stop "<|user|>"\n'
    )


def _unknown_runs_collapsed(ids: list[int], byte_ids: set[int], unk_id: int) -> list[int]:
    """transformers' ids with each run of byte-fallback pieces as one unknown token: what llama.cpp's unigram
    tokenizer (no byte fallback) gives for characters outside the vocabulary."""
    out: list[int] = []
    for token in ids:
        if token in byte_ids:
            if not out or out[-1] != unk_id:
                out.append(unk_id)
        else:
            out.append(token)
    return out


def compare_with_llama_cpp(gguf_path: str | os.PathLike, model_dir: str | os.PathLike, texts: list[str],
                           prompt: str, new_tokens: int = 20) -> dict:
    """Run the GGUF in llama.cpp (llama-cpp-python) beside transformers: tokenization of each text and of the chat
    prompt, the logits on the first text's ids, and `new_tokens` greedy tokens after the same prompt ids. Returns the
    comparison; the caller decides.

    `texts_equal` counts identical ids; `texts_equal_but_unknown_characters` counts texts whose only differences are
    characters outside the vocabulary (byte pieces in transformers, one `<|unk|>` in llama.cpp's unigram tokenizer,
    which has no byte fallback)."""
    Llama = _require("llama_cpp", "llama", "running a GGUF in llama.cpp").Llama


    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    model = HitobanForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocab = tokenizer_json(Path(model_dir))["model"]
    byte_ids = {i for i, (piece, _) in enumerate(vocab["vocab"]) if BYTE_PIECE.fullmatch(piece)}
    llm = Llama(model_path=str(gguf_path), n_ctx=model.config.max_position_embeddings, n_threads=os.cpu_count(),
                logits_all=True, type_k=0, type_v=0, verbose=False)  # f32 KV cache (GGML_TYPE_F32), not f16
    try:
        equal = modulo_unknown = 0
        for text in texts:
            ours = tokenizer(text)["input_ids"]
            theirs = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
            equal += ours == theirs
            modulo_unknown += ours != theirs and _unknown_runs_collapsed(ours, byte_ids, vocab["unk_id"]) == theirs
        prompt_ids = tokenizer(prompt)["input_ids"]
        prompt_equal = prompt_ids == llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
        logit_ids = tokenizer(texts[0] if texts else prompt)["input_ids"][: model.config.max_position_embeddings]
        llm.reset()
        llm.eval(logit_ids)
        with torch.no_grad():
            logits = model(torch.tensor([logit_ids])).logits[0].numpy()
        max_logit_diff = float(np.abs(np.asarray(llm.scores[: len(logit_ids)]) - logits).max())
        llm.reset()
        with torch.no_grad():
            greedy = model.generate(torch.tensor([prompt_ids]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                    do_sample=False, pad_token_id=model.config.pad_token_id)[0, len(prompt_ids):]
        llama_greedy = []
        for token in llm.generate(prompt_ids, top_k=1, temp=0.0, repeat_penalty=1.0):
            llama_greedy.append(token)
            if len(llama_greedy) == new_tokens:
                break
    finally:
        llm.close()
    greedy = greedy.tolist()
    pairs = list(zip(greedy, llama_greedy))
    same = next((i for i, (a, b) in enumerate(pairs) if a != b), len(pairs))
    return {"texts": len(texts), "texts_equal": equal, "texts_equal_but_unknown_characters": modulo_unknown,
            "prompt_tokenized_equal": prompt_equal, "max_abs_logit_diff": max_logit_diff,
            "logit_positions": len(logit_ids), "greedy_transformers": greedy, "greedy_llama_cpp": llama_greedy,
            "greedy_equal_prefix": same}


def verify_gguf(gguf_path: str | os.PathLike, model_dir: str | os.PathLike, outtype: str) -> dict:
    """`export-gguf --verify`: llama.cpp must tokenize as transformers (characters outside the vocabulary aside),
    and give the same greedy tokens (and, for f32, logits within 1e-4); else CheckFailed."""
    report = compare_with_llama_cpp(gguf_path, model_dir, list(TOKENIZER_CHECK_TEXTS), VERIFY_PROMPT)
    problems = []
    if report["texts_equal"] + report["texts_equal_but_unknown_characters"] < report["texts"]:
        problems.append("llama.cpp tokenizes text differently")
    if not report["prompt_tokenized_equal"]:
        problems.append("llama.cpp tokenizes the chat prompt differently")
    if report["greedy_equal_prefix"] < GREEDY_TOKENS_EQUAL[outtype]:
        problems.append(f"{report['greedy_equal_prefix']} greedy tokens equal, {GREEDY_TOKENS_EQUAL[outtype]} needed")
    if outtype == "f32" and report["max_abs_logit_diff"] > 1e-4:
        problems.append(f"f32 logits differ by {report['max_abs_logit_diff']:.3g}")
    if problems:
        raise CheckFailed(f"{Path(gguf_path).name} does not run in llama.cpp as in transformers: {'; '.join(problems)}")
    return report
