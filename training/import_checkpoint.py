"""Import existing checkpoints into a hitoban `from_pretrained` folder (docs/design.md §2).

Formats:
- `3lm`: a 3LM-MLX folder: `model.safetensors` (tok_emb, blocks.{i}.ln1/ln2, attn.qkv/proj, mlp.gate/up/down,
  ln_f) + `config.json` (n_layer, n_head, n_embd, block_size, mlp_hidden, rope_theta, norm_eps, vocab_size, arch).
  Its SentencePiece `tokenizer.model` (in the folder or `tokenizer/`) is converted too when present.
- `zxell`: a torch checkpoint (`*.pt`): a dict with the weights under `model` (tok_emb, blocks.N.norm1/norm2,
  attn.qkv/proj, ffn.w_gate/w_up/w_down, norm_f, tied lm_head) and the shape under `config` (or `model_config`,
  `args`). Read with `torch.load(weights_only=True)`: a checkpoint can never run code here.
Every source tensor must be used and every model tensor filled; anything else is an error naming the tensors.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from hitoban.errors import InputError, MissingInputError, OutputExistsError, UsageError
from hitoban.modeling import HitobanConfig, HitobanForCausalLM
from hitoban.training.data.tokenizer import tokenizers_from_sentencepiece, wrap_for_transformers
from hitoban.training.import_options import FORMATS

_3LM_NAMES = {
    "ln1.weight": "input_layernorm.weight",
    "ln2.weight": "post_attention_layernorm.weight",
    "attn.qkv.weight": "self_attn.qkv_proj.weight",
    "attn.proj.weight": "self_attn.o_proj.weight",
    "mlp.down.weight": "mlp.down_proj.weight",
}
_ZXELL_NAMES = {
    "norm1.weight": "input_layernorm.weight",
    "norm2.weight": "post_attention_layernorm.weight",
    "attn.qkv.weight": "self_attn.qkv_proj.weight",
    "attn.proj.weight": "self_attn.o_proj.weight",
    "ffn.w_down.weight": "mlp.down_proj.weight",
}
_FORMAT_NAMES = {
    "3lm": dict(blocks=_3LM_NAMES, embed="tok_emb.weight", final_norm="ln_f.weight",
                gate="mlp.gate.weight", up="mlp.up.weight"),
    "zxell": dict(blocks=_ZXELL_NAMES, embed="tok_emb.weight", final_norm="norm_f.weight",
                  gate="ffn.w_gate.weight", up="ffn.w_up.weight"),
}


class CheckpointFormatError(InputError):
    """The source does not look like the format it was given as (names the offending tensors or keys)."""


def detect_format(src: Path) -> str:
    if src.is_file() and src.suffix in (".pt", ".pth", ".bin"):
        return "zxell"
    if src.is_dir():
        if (src / "model.safetensors").exists() and (src / "config.json").exists():
            config = json.loads((src / "config.json").read_text())
            if "n_embd" in config:
                return "3lm"
        if list(src.glob("*.pt")):
            return "zxell"
    raise CheckpointFormatError(
        f"{src}: cannot tell the checkpoint format (expected a 3LM folder with model.safetensors + config.json "
        "holding n_embd, or a zxell *.pt file); pass --format 3lm|zxell"
    )


def _pick(config: dict, *names, default=None):
    for name in names:
        if name in config:
            return config[name]
    if default is None:
        raise CheckpointFormatError(f"checkpoint config lacks {names[0]!r} (also looked for {names[1:]})")
    return default


def rename_weights(weights: dict[str, torch.Tensor], fmt: str, num_layers: int) -> dict[str, torch.Tensor]:
    """Map source names to hitoban names; fuse gate/up. Raises on unknown or missing tensors."""
    names = _FORMAT_NAMES[fmt]
    weights = {re.sub(r"^(_orig_mod\.|module\.)", "", k): v for k, v in weights.items()}
    embed = weights.get(names["embed"])
    if fmt == "zxell" and "lm_head.weight" in weights:
        if embed is None or not torch.equal(weights["lm_head.weight"], embed):
            raise CheckpointFormatError("lm_head.weight differs from tok_emb.weight: hitoban needs tied embeddings")
    used = {"lm_head.weight"} if fmt == "zxell" else set()
    out, missing = {}, []

    def take(name: str):
        if name not in weights:
            missing.append(name)
            return None
        used.add(name)
        return weights[name]

    out["model.embed_tokens.weight"] = take(names["embed"])
    out["model.norm.weight"] = take(names["final_norm"])
    for i in range(num_layers):
        for src_name, dst_name in names["blocks"].items():
            out[f"model.layers.{i}.{dst_name}"] = take(f"blocks.{i}.{src_name}")
        gate, up = take(f"blocks.{i}.{names['gate']}"), take(f"blocks.{i}.{names['up']}")
        if gate is not None and up is not None:
            out[f"model.layers.{i}.mlp.gate_up_proj.weight"] = torch.cat([gate, up], dim=0)
    unknown = sorted(set(weights) - used)
    if missing or unknown:
        raise CheckpointFormatError(
            f"{fmt} checkpoint does not match: missing tensors {missing or 'none'}; unknown tensors {unknown or 'none'}"
        )
    return {k: v.float().contiguous() for k, v in out.items()}


def _load_3lm(src: Path) -> tuple[HitobanConfig, dict, Path | None]:
    config = json.loads((src / "config.json").read_text())
    if config.get("arch", "2lm") != "3lm":
        raise CheckpointFormatError(
            f"{src}: arch {config.get('arch', '2lm (no arch key)')!r} is not supported; only arch '3lm' "
            "(RoPE/RMSNorm/SwiGLU) maps onto hitoban"
        )
    weights = load_file(src / "model.safetensors")
    hidden = _pick(config, "n_embd")
    hf_config = HitobanConfig(
        vocab_size=weights["tok_emb.weight"].shape[0] if "tok_emb.weight" in weights else _pick(config, "vocab_size"),
        hidden_size=hidden,
        num_hidden_layers=_pick(config, "n_layer"),
        num_attention_heads=_pick(config, "n_head"),
        intermediate_size=config.get("mlp_hidden") or None,
        max_position_embeddings=_pick(config, "block_size"),
        rope_theta=float(config.get("rope_theta", 10000.0)),
        rms_norm_eps=float(config.get("norm_eps", 1e-5)),
    )
    tokenizer = next((p for p in (src / "tokenizer.model", src / "tokenizer" / "tokenizer.model") if p.exists()), None)
    return hf_config, weights, tokenizer


def _load_zxell(src: Path) -> tuple[HitobanConfig, dict, Path | None]:
    path = src if src.is_file() else sorted(src.glob("*.pt"))[0]
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict) or "model" not in checkpoint:
        found = list(checkpoint)[:8] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise CheckpointFormatError(f"{path}: expected a dict with a 'model' state dict, got {found}")
    weights = checkpoint["model"]
    sections = ("config", "model_config", "args")
    config = next((checkpoint[k] for k in sections if isinstance(checkpoint.get(k), dict)), None)
    if config is None:
        raise CheckpointFormatError(f"{path}: no 'config' section with the model shape")
    config = config.get("model", config)  # some runs nest the model shape under config["model"]
    embed = weights.get("tok_emb.weight", weights.get("_orig_mod.tok_emb.weight"))
    if embed is None:
        raise CheckpointFormatError(f"{path}: missing tensors ['tok_emb.weight']")
    hf_config = HitobanConfig(
        vocab_size=embed.shape[0],
        hidden_size=embed.shape[1],
        num_hidden_layers=_pick(config, "n_layer", "n_layers", "num_layers", "num_hidden_layers"),
        num_attention_heads=_pick(config, "n_head", "n_heads", "num_heads", "num_attention_heads"),
        intermediate_size=config.get("ffn_hidden") or config.get("d_ff") or config.get("intermediate_size") or None,
        max_position_embeddings=_pick(config, "block_size", "ctx_len", "context_length", "max_seq_len", "seq_len"),
        rope_theta=float(config.get("rope_theta", config.get("rope_base", 10000.0))),
        rms_norm_eps=float(config.get("norm_eps", config.get("rms_norm_eps", 1e-5))),
    )
    tokenizer = next(iter(sorted((src if src.is_dir() else src.parent).glob("*.model"))), None)
    return hf_config, weights, tokenizer


def import_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, fmt: str | None = None) -> dict:
    """Convert `src` (3LM folder or zxell .pt) into a hitoban folder at `dst` (written to a temp dir, then renamed)."""
    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise MissingInputError(f"{src} does not exist")
    if dst.exists():
        raise OutputExistsError(f"{dst} already exists; choose a new folder")
    fmt = fmt or detect_format(src)
    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}; choose one of {FORMATS}")
    config, weights, spm_model = (_load_3lm if fmt == "3lm" else _load_zxell)(src)
    state = rename_weights(weights, fmt, config.num_hidden_layers)
    gate_up = state["model.layers.0.mlp.gate_up_proj.weight"]
    config.intermediate_size = gate_up.shape[0] // 2  # the tensors, not the config, are the truth
    model = HitobanForCausalLM(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise CheckpointFormatError(f"shape/name mismatch after mapping: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=f".{dst.name}.tmp") as tmp:
        staged = Path(tmp) / "model"
        model.save_pretrained(staged)
        if spm_model is not None:
            tok = tokenizers_from_sentencepiece(spm_model.read_bytes())
            wrap_for_transformers(tok, config.max_position_embeddings).save_pretrained(staged)
        os.replace(staged, dst)
    return {"format": fmt, "parameters": sum(p.numel() for p in model.parameters()),
            "tokenizer": spm_model is not None, "out": dst.name}
