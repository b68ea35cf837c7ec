"""The Llama format's pieces both exports share (`export_llama`, `export_gguf`): hitoban weights under Llama's
names, the SentencePiece model rebuilt from `tokenizer.json`, and the chat template as llama.cpp can parse it.

`sentencepiece_model` rebuilds the SentencePiece model from `tokenizer.json` (any hitoban folder has one; the
trainer's own `sentencepiece.model` is not copied into checkpoints), and checks that SentencePiece then gives the
same ids as transformers. `hitoban export-llama` writes it as `tokenizer.model` so that llama.cpp's unmodified
`convert_hf_to_gguf.py` reads the export right too.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from sentencepiece import SentencePieceProcessor
from sentencepiece import sentencepiece_model_pb2 as sp_pb2
from tokenizers import Tokenizer
from transformers import LlamaForCausalLM

from hitoban.errors import CheckFailed, InputError

from .configuration_hitoban import HitobanConfig
from .modeling_hitoban import HitobanForCausalLM

# Held-out-like text for the tokenizer self-check: kana, kanji, full-width punctuation, ASCII with runs of spaces,
# newlines, an emoji and a rare character (byte fallback).
TOKENIZER_CHECK_TEXTS = (
    "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。",
    "「おはよう！」と彼は言った。  Hello,  world.\n\n次の行　全角スペース？",
    "東京都 2026年12月1日 🍣🐈 𠮷野家 ｶﾀｶﾅ ＡＢＣ",
)
# A `{% generation %}` block is transformers-only Jinja (assistant masks); llama.cpp's Jinja does not parse it.
GENERATION_TAGS = re.compile(r"\{%-?\s*(end)?generation\s*-?%\}")
BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")

def tokenizer_json(folder: Path) -> dict:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise InputError(f"{folder} has no tokenizer.json; export a folder that hitoban wrote (final/, sft, tone)")
    data = json.loads(path.read_text(encoding="utf-8"))
    model = data.get("model", {})
    normalizer = data.get("normalizer") or {}
    if (model.get("type") != "Unigram" or not model.get("byte_fallback") or data.get("pre_tokenizer") is not None
            or normalizer.get("type") != "Replace" or normalizer.get("content") != "▁"):
        raise InputError(f"{path}: not a hitoban tokenizer (a Unigram with byte fallback, spaces as '▁', no "
                         "pre-tokenizer); llama.cpp's SentencePiece vocabulary cannot express it")
    return data


def sentencepiece_model(folder: str | os.PathLike, check_texts=TOKENIZER_CHECK_TEXTS) -> bytes:
    """A serialized SentencePiece ModelProto equal to the folder's `tokenizer.json`, checked id for id."""
    folder = Path(folder)
    data = tokenizer_json(folder)
    vocab, unk_id = data["model"]["vocab"], data["model"]["unk_id"]
    control = {t["id"] for t in data.get("added_tokens", []) if t.get("special")} - {unk_id}
    proto = sp_pb2.ModelProto()
    for index, (piece, score) in enumerate(vocab):
        entry = proto.pieces.add(piece=piece, score=score)
        if index == unk_id:
            entry.type = sp_pb2.ModelProto.SentencePiece.UNKNOWN
        elif index in control:
            entry.type = sp_pb2.ModelProto.SentencePiece.CONTROL
        elif BYTE_PIECE.fullmatch(piece):
            entry.type = sp_pb2.ModelProto.SentencePiece.BYTE
    trainer = proto.trainer_spec
    trainer.model_type = sp_pb2.TrainerSpec.UNIGRAM
    trainer.vocab_size, trainer.byte_fallback = len(vocab), True
    trainer.unk_id, trainer.bos_id, trainer.eos_id, trainer.pad_id = unk_id, -1, -1, -1
    trainer.unk_piece = vocab[unk_id][0]
    normalizer = proto.normalizer_spec
    normalizer.name, normalizer.add_dummy_prefix = "identity", False
    normalizer.remove_extra_whitespaces, normalizer.escape_whitespaces = False, True
    serialized = proto.SerializeToString()

    ours, theirs = SentencePieceProcessor(model_proto=serialized), Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in check_texts:
        expected = theirs.encode(text, add_special_tokens=False).ids
        if ours.encode(text) != expected:
            raise CheckFailed(f"the SentencePiece model does not tokenize {text[:20]!r} as tokenizer.json does; "
                              "nothing was written")
    return serialized


def llama_cpp_chat_template(template: str) -> str:
    """The chat template without transformers' `{% generation %}` markers (llama.cpp's Jinja rejects them)."""
    return GENERATION_TAGS.sub("", template)


def llama_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Rename/split hitoban weights into Llama names (lm_head only when untied)."""
    out = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        if name.endswith("self_attn.qkv_proj.weight"):
            prefix = name[: -len("qkv_proj.weight")]
            for part, chunk in zip(("q_proj", "k_proj", "v_proj"), tensor.chunk(3, dim=0)):
                out[f"{prefix}{part}.weight"] = chunk.clone()
        elif name.endswith("mlp.gate_up_proj.weight"):
            prefix = name[: -len("gate_up_proj.weight")]
            gate, up = tensor.chunk(2, dim=0)
            out[f"{prefix}gate_proj.weight"], out[f"{prefix}up_proj.weight"] = gate.clone(), up.clone()
        else:
            out[name] = tensor.clone()
    return out


def hitoban_state_dict(llama_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`llama_state_dict`'s inverse: Llama's q/k/v and gate/up rows fused back into hitoban's projections."""
    out, parts = {}, {}
    for name, tensor in llama_state.items():
        for pieces, fused in ((("q_proj", "k_proj", "v_proj"), "qkv_proj"), (("gate_proj", "up_proj"), "gate_up_proj")):
            piece = next((p for p in pieces if name.endswith(f".{p}.weight")), None)
            if piece is not None:
                prefix = name[: -len(f"{piece}.weight")]
                parts.setdefault((prefix, fused, pieces), {})[piece] = tensor
                break
        else:
            out[name] = tensor
    for (prefix, fused, pieces), found in parts.items():
        if set(found) != set(pieces):
            raise ValueError(f"{prefix}: a Llama checkpoint needs all of {pieces}, found {sorted(found)}")
        out[f"{prefix}{fused}.weight"] = torch.cat([found[p] for p in pieces], dim=0)
    return out


def from_llama(path, **kwargs):
    """hitoban's class on a Llama folder (`hitoban export-llama`'s, or a published `--format llama` repo): the
    shape read from its config, the weights fused back; a Llama that hitoban's architecture cannot express (grouped
    KV heads, biases, RoPE scaling, another activation) is refused by name. `kwargs` go to `from_pretrained`."""

    llama = LlamaForCausalLM.from_pretrained(path, **kwargs)
    c = llama.config
    rope = getattr(c, "rope_parameters", None) or {}
    unsupported = {"num_key_value_heads": c.num_key_value_heads != c.num_attention_heads,
                   "attention_bias": bool(c.attention_bias), "mlp_bias": bool(getattr(c, "mlp_bias", False)),
                   "hidden_act": c.hidden_act != "silu", "rope_type": rope.get("rope_type", "default") != "default",
                   "head_dim": getattr(c, "head_dim", None) not in (None, c.hidden_size // c.num_attention_heads)}
    if any(unsupported.values()):
        raise ValueError(f"{path}: this Llama uses {[k for k, v in unsupported.items() if v]}, which hitoban's "
                         "architecture does not have; load it with LlamaForCausalLM")
    config = HitobanConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                           num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                           max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
                           rope_theta=rope.get("rope_theta", 10000.0), tie_word_embeddings=c.tie_word_embeddings,
                           bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id)
    model = HitobanForCausalLM(config).to(llama.dtype)
    state = hitoban_state_dict({k: v for k, v in llama.state_dict().items()
                                if not (k == "lm_head.weight" and c.tie_word_embeddings)})
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"{path}: Llama weights do not map onto hitoban's: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()
