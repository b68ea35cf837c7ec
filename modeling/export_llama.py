"""Export a hitoban folder as a plain `LlamaForCausalLM` folder (no remote code needed downstream).

The architectures are the same function (docs/design.md §2): fused qkv rows split into q/k/v_proj, fused gate/up rows
split into gate_proj/up_proj, everything else renamed 1:1, tied embeddings kept tied. llama.cpp, vLLM and
transformers.js users can then load the model as Llama. The export verifies itself: logits on random tokens must
match to 1e-5 in fp32 and greedy generations must be identical, else nothing is written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hitoban.errors import CheckFailed, OutputExistsError
from hitoban.files import TOKENIZER_FILES
from hitoban.modeling.loading import check_model_folder
from hitoban.provenance import LLAMA_EXPORT_STAGE, read_lineage, weights_sha256, write_lineage

from .configuration_hitoban import HitobanConfig
from .llama_format import llama_cpp_chat_template, llama_state_dict, sentencepiece_model
from .modeling_hitoban import HitobanForCausalLM


def llama_config(config: HitobanConfig) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_attention_heads,
        hidden_act="silu",
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(config.rope_theta)},
        tie_word_embeddings=config.tie_word_embeddings,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )


def to_llama(model: HitobanForCausalLM) -> LlamaForCausalLM:
    llama = LlamaForCausalLM(llama_config(model.config)).to(dtype=model.dtype).eval()
    missing, unexpected = llama.load_state_dict(llama_state_dict(model), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not model.config.tie_word_embeddings]
    if missing or unexpected:
        raise RuntimeError(f"Llama export mapping is incomplete: missing {missing}, unexpected {unexpected}")
    if model.config.tie_word_embeddings:
        llama.tie_weights()
    return llama


@torch.no_grad()
def compare_logits(ours, theirs, vocab_size: int, seq_len: int = 64, seed: int = 0) -> float:
    """Max |logit difference| on random token batches (fp32)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (2, seq_len), generator=generator)
    return (ours(ids).logits.float() - theirs(ids).logits.float()).abs().max().item()


def write_llama_cpp_tokenizer_files(src: str | os.PathLike, dst: Path) -> None:
    """What llama.cpp's `convert_hf_to_gguf.py` reads besides tokenizer.json (see export_gguf's docstring): the
    SentencePiece model as `tokenizer.model`, `add_prefix_space` / `add_bos_token` false in tokenizer_config.json
    (transformers ignores both for this tokenizer: the ids stay the same, a test checks), and the chat template
    without `{% generation %}` (so a Llama export no longer gives assistant masks; fine-tune the hitoban folder)."""
    (dst / "tokenizer.model").write_bytes(sentencepiece_model(src))
    template = dst / "chat_template.jinja"
    if template.exists():  # llama.cpp's Jinja cannot parse transformers' {% generation %} markers
        template.write_text(llama_cpp_chat_template(template.read_text(encoding="utf-8")), encoding="utf-8")
    config_path = dst / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.exists() else {}
    config.update(add_prefix_space=False, add_bos_token=False, add_eos_token=False)
    config_path.write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")


def check_same_model(ours: HitobanForCausalLM, llama: LlamaForCausalLM, atol: float = 1e-5) -> dict:
    """The export's verification: logits on random tokens within `atol` (fp32) and the same greedy text; raises
    CheckFailed otherwise. Returns what it measured."""
    ours, llama = ours.float().eval(), llama.float().eval()
    max_diff = compare_logits(ours, llama, ours.config.vocab_size, seq_len=min(64, ours.config.max_position_embeddings))
    prompt = torch.arange(1, 9)[None] % ours.config.vocab_size
    greedy = dict(max_new_tokens=16, do_sample=False, pad_token_id=ours.config.pad_token_id)
    same_greedy = torch.equal(ours.generate(prompt, **greedy), llama.generate(prompt, **greedy))
    if max_diff > atol or not same_greedy:
        raise CheckFailed(f"Llama export does not match: max |logit diff| {max_diff:.3g}, greedy equal {same_greedy}")
    return {"max_abs_logit_diff": max_diff, "greedy_identical": same_greedy, "atol": atol}


def verify_llama_export(src: str | os.PathLike, export: str | os.PathLike, atol: float = 1e-5) -> dict:
    """Check a saved Llama export against the hitoban folder it was made from, as both load from disk (what an
    upload would send): its lineage names these hitoban weights, and the two compute the same thing."""
    src, export = Path(src), Path(export)
    lineage = read_lineage(export) or {}
    source = (lineage.get("base") or {}).get("weights_sha256")
    if lineage.get("stage") != LLAMA_EXPORT_STAGE or lineage.get("weights_sha256") != weights_sha256(export):
        raise CheckFailed(f"{export}: not a verified Llama export (its lineage.json is missing, of another stage, "
                          "or of other weights); make it with `hitoban export-llama`")
    if source != weights_sha256(src):
        raise CheckFailed(f"{export} was exported from other weights (sha256 {str(source)[:12]}), not {src}'s: "
                          "remove it and export again")
    if json.loads((export / "config.json").read_text(encoding="utf-8")).get("model_type") != "llama":
        raise CheckFailed(f"{export}/config.json is not a Llama config")
    ours = HitobanForCausalLM.from_pretrained(src, dtype=torch.float32)
    llama = LlamaForCausalLM.from_pretrained(export, dtype=torch.float32)
    return {**check_same_model(ours, llama, atol), "source_weights_sha256": source}


def export_llama(src: str | os.PathLike, dst: str | os.PathLike, atol: float = 1e-5) -> dict:
    """Write `dst` as a LlamaForCausalLM folder (+ tokenizer files) after checking it computes what `src` does;
    its lineage.json records the check and the hitoban weights (and their lineage) it was made from, which is what
    lets `card` and `upload --format llama` cite the measurements of those weights."""
    dst = Path(dst)
    if dst.exists():
        raise OutputExistsError(f"{dst} already exists; choose a new folder")
    check_model_folder(src, tokenizer=(Path(src) / "tokenizer.json").exists())  # the one model-folder check
    ours = HitobanForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    llama = to_llama(ours)
    checked = check_same_model(ours, llama, atol)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=f".{dst.name}.tmp") as tmp:
        staged = Path(tmp) / "llama"
        llama.save_pretrained(staged)
        for name in TOKENIZER_FILES:
            if (Path(src) / name).exists():
                shutil.copy2(Path(src) / name, staged / name)
        if (Path(src) / "tokenizer.json").exists():
            write_llama_cpp_tokenizer_files(src, staged)
        lineage = write_lineage(staged, LLAMA_EXPORT_STAGE, base_dir=src, format="llama", verification=checked)
        os.replace(staged, dst)
    return {**checked, "source_weights_sha256": lineage["base"]["weights_sha256"], "out": dst.name}
