"""Llama export and checkpoint import (3LM MLX safetensors, zxell torch) against independent references."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from hitoban.cli import main
from hitoban.training.import_checkpoint import CheckpointFormatError, import_checkpoint

VOCAB, DIM, LAYERS, HEADS, MLP, CTX = 300, 32, 2, 4, 96, 64


def reference_forward(weights: dict, names: dict, ids: torch.Tensor, theta: float = 10000.0, eps: float = 1e-5):
    """The 3LM architecture written out from its description (docs/design.md §2), independent of hitoban's code."""

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    seq, hd = ids.shape[1], DIM // HEADS
    inv = 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd)
    angles = torch.arange(seq).float()[:, None] * inv[None]  # (seq, hd/2)
    cos, sin = angles.cos(), angles.sin()

    def rope(x):  # pairs (i, i + hd/2): non-interleaved
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    emb = weights[names["embed"]]
    x = emb[ids]
    causal = torch.ones(seq, seq).tril().bool()
    for i in range(LAYERS):
        def w(key, i=i):
            return weights[f"blocks.{i}.{names[key]}"]

        h = rms(x, w("ln1"))
        q, k, v = (h @ w("qkv").T).split(DIM, dim=-1)
        q, k, v = (t.view(1, seq, HEADS, hd).transpose(1, 2) for t in (q, k, v))
        scores = (rope(q) @ rope(k).transpose(-1, -2)) / hd**0.5
        attn = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + attn.transpose(1, 2).reshape(1, seq, DIM) @ w("proj").T
        h = rms(x, w("ln2"))
        x = x + (F.silu(h @ w("gate").T) * (h @ w("up").T)) @ w("down").T
    return rms(x, weights[names["final"]]) @ emb.T


def random_weights(names: dict) -> dict:
    g = torch.Generator().manual_seed(0)
    shapes = {"ln1": (DIM,), "ln2": (DIM,), "qkv": (3 * DIM, DIM), "proj": (DIM, DIM), "gate": (MLP, DIM),
              "up": (MLP, DIM), "down": (DIM, MLP)}
    weights = {names["embed"]: torch.randn(VOCAB, DIM, generator=g) * 0.2,
               names["final"]: 1 + 0.1 * torch.randn(DIM, generator=g)}
    for i in range(LAYERS):
        for key, shape in shapes.items():
            scale = 0.1 if len(shape) == 1 else shape[1] ** -0.5
            base = 1.0 if len(shape) == 1 else 0.0
            weights[f"blocks.{i}.{names[key]}"] = base + scale * torch.randn(*shape, generator=g)
    return weights


NAMES_3LM = dict(embed="tok_emb.weight", final="ln_f.weight", ln1="ln1.weight", ln2="ln2.weight",
                 qkv="attn.qkv.weight", proj="attn.proj.weight", gate="mlp.gate.weight", up="mlp.up.weight",
                 down="mlp.down.weight")
NAMES_ZXELL = dict(embed="tok_emb.weight", final="norm_f.weight", ln1="norm1.weight", ln2="norm2.weight",
                   qkv="attn.qkv.weight", proj="attn.proj.weight", gate="ffn.w_gate.weight", up="ffn.w_up.weight",
                   down="ffn.w_down.weight")


def write_3lm(folder, weights, **config_changes):
    folder.mkdir()
    save_file(weights, folder / "model.safetensors")
    config = dict(vocab_size=VOCAB, block_size=CTX, n_layer=LAYERS, n_head=HEADS, n_embd=DIM, dropout=0.0,
                  arch="3lm", mlp_hidden=MLP, rope_theta=10000.0, norm_eps=1e-5, **config_changes)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def test_import_3lm_gives_the_reference_logits(tmp_path):
    weights = random_weights(NAMES_3LM)
    src = write_3lm(tmp_path / "3lm", weights)
    report = import_checkpoint(src, tmp_path / "out")  # format detected from the files
    assert report["format"] == "3lm"
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.randint(0, VOCAB, (1, 40))
    with torch.no_grad():
        diff = (model(ids).logits - reference_forward(weights, NAMES_3LM, ids)).abs().max().item()
    assert diff < 1e-4


def test_import_zxell_torch_checkpoint_gives_the_reference_logits(tmp_path):
    weights = random_weights(NAMES_ZXELL)
    state = {**weights, "lm_head.weight": weights["tok_emb.weight"]}
    config = {"model": {"n_layer": LAYERS, "n_head": HEADS, "d_model": DIM, "ctx_len": CTX, "vocab_size": VOCAB}}
    torch.save({"model": state, "config": config, "step": 90000}, tmp_path / "ckpt.pt")
    assert import_checkpoint(tmp_path / "ckpt.pt", tmp_path / "out")["format"] == "zxell"
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.randint(0, VOCAB, (1, 40))
    with torch.no_grad():
        diff = (model(ids).logits - reference_forward(weights, NAMES_ZXELL, ids)).abs().max().item()
    assert diff < 1e-4


def test_import_names_unknown_and_missing_tensors(tmp_path):
    weights = random_weights(NAMES_3LM)
    weights["blocks.0.attn.bias_extra"] = torch.zeros(3)
    del weights["blocks.1.mlp.up.weight"]
    src = write_3lm(tmp_path / "bad", weights)
    with pytest.raises(CheckpointFormatError, match=r"blocks\.1\.mlp\.up\.weight.*blocks\.0\.attn\.bias_extra"):
        import_checkpoint(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_import_refuses_legacy_2lm_and_untied_zxell(tmp_path):
    src = write_3lm(tmp_path / "2lm", random_weights(NAMES_3LM), **{})
    config = json.loads((src / "config.json").read_text())
    config["arch"] = "2lm"
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointFormatError, match="2lm"):
        import_checkpoint(src, tmp_path / "out")
    weights = random_weights(NAMES_ZXELL)
    torch.save({"model": {**weights, "lm_head.weight": torch.zeros(VOCAB, DIM)},
                "config": {"n_layer": LAYERS, "n_head": HEADS, "block_size": CTX}}, tmp_path / "untied.pt")
    with pytest.raises(CheckpointFormatError, match="tied"):
        import_checkpoint(tmp_path / "untied.pt", tmp_path / "out2")


def test_import_converts_the_3lm_sentencepiece_tokenizer(tmp_path, tokenizer_dir):
    src = write_3lm(tmp_path / "3lm", random_weights(NAMES_3LM))
    (src / "tokenizer").mkdir()
    (src / "tokenizer" / "tokenizer.model").write_bytes((tokenizer_dir / "sentencepiece.model").read_bytes())
    assert import_checkpoint(src, tmp_path / "out")["tokenizer"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tok.convert_tokens_to_ids("<|end|>") == 3 and tok.decode(tok("吾輩は猫")["input_ids"]) == "吾輩は猫"


def test_export_llama_matches_logits_and_greedy_text(tmp_path, tiny_model_dir, capsys):
    assert main(["export-llama", str(tiny_model_dir), str(tmp_path / "llama")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["max_abs_logit_diff"] <= 1e-5 and report["greedy_identical"]
    llama = LlamaForCausalLM.from_pretrained(tmp_path / "llama").eval()
    ours = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = torch.randint(0, ours.config.vocab_size, (2, 50))
    with torch.no_grad():
        assert (llama(ids).logits - ours(ids).logits).abs().max() <= 1e-5
    config = json.loads((tmp_path / "llama" / "config.json").read_text())
    assert config["model_type"] == "llama" and "auto_map" not in config
    assert (tmp_path / "llama" / "tokenizer.json").exists()


def test_cli_reports_conversion_errors_cleanly(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["import", str(tmp_path / "empty"), str(tmp_path / "out")]) == 2
    assert "cannot tell the checkpoint format" in capsys.readouterr().err
