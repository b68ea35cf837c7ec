"""GGUF for llama.cpp: the SentencePiece vocabulary, `hitoban export-gguf`, llama.cpp's own unmodified converter on
`hitoban export-llama`, and llama.cpp itself (llama-cpp-python, an optional extra) against transformers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sdist import fetch

from hitoban.cli import main
from hitoban.errors import CheckFailed, InputError
from hitoban.modeling.export_gguf import _permute_for_rope, export_gguf
from hitoban.modeling.llama_format import sentencepiece_model

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # its archive vendors llama.cpp's convert_hf_to_gguf.py
CHAT_PROMPT = "<|user|>吾輩は猫である。名前は？<|assistant|>"


@pytest.fixture(scope="module")
def heldout(corpus) -> list[str]:
    """200 held-out chats (3LM's evaluation text, `<|user|>Q<|assistant|>A`), never seen by the tokenizer."""
    lines = (corpus / "3lm-eval" / "holdout_clean.txt").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip()][:200]


def _reader(path):
    import gguf

    reader = gguf.GGUFReader(path)
    fields = {name: field.contents() for name, field in reader.fields.items()}
    tensors = {t.name: t for t in reader.tensors}
    return fields, tensors


def test_sentencepiece_model_tokenizes_heldout_text_as_tokenizer_json_does(tiny_model_dir, tokenizer_dir, heldout):
    from sentencepiece import SentencePieceProcessor
    from sentencepiece import sentencepiece_model_pb2 as sp_pb2
    from tokenizers import Tokenizer

    proto = sentencepiece_model(tiny_model_dir)
    ours = SentencePieceProcessor(model_proto=proto)
    theirs = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    # SentencePiece never matches CONTROL pieces in text (llama.cpp does, with special=True: tested below)
    texts = [re.sub(r"<\|\w+\|>", "\n", t) for t in heldout] + [" 先頭の空白と  連続空白", "改行\n\nのあと", "🍣𠮷"]
    assert all(ours.encode(t) == theirs.encode(t, add_special_tokens=False).ids for t in texts)
    # and as the trainer's own model did (the rebuilt proto is the same vocabulary, not a look-alike)
    trained = SentencePieceProcessor(model_file=str(tokenizer_dir / "sentencepiece.model"))
    assert all(ours.encode(t) == trained.encode(t) for t in texts)
    # negative control: SentencePiece's default dummy prefix (what llama.cpp assumes) changes the ids
    model = sp_pb2.ModelProto.FromString(proto)
    model.normalizer_spec.add_dummy_prefix = True
    prefixed = SentencePieceProcessor(model_proto=model.SerializeToString())
    assert sum(prefixed.encode(t) != theirs.encode(t, add_special_tokens=False).ids for t in texts) > len(texts) // 2


def test_sentencepiece_model_refuses_a_tokenizer_it_cannot_express(tmp_path, tiny_model_dir):
    data = json.loads((tiny_model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    data["normalizer"] = {"type": "NFKC"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(InputError, match="not a hitoban tokenizer"):
        sentencepiece_model(tmp_path)


def test_export_gguf_writes_the_vocabulary_settings_and_weights(tmp_path, tiny_model_dir, capsys):
    from hitoban import HitobanForCausalLM

    assert main(["export-gguf", str(tiny_model_dir), str(tmp_path / "m.gguf")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["outtype"] == "f32" and (tmp_path / "m.Modelfile").read_text().startswith("# ollama create")
    fields, tensors = _reader(tmp_path / "m.gguf")
    tokenizer = json.loads((tiny_model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    assert fields["general.architecture"] == "llama" and fields["tokenizer.ggml.model"] == "t5"  # unigram
    assert fields["tokenizer.ggml.tokens"] == [piece for piece, _ in tokenizer["model"]["vocab"]]
    assert np.allclose(fields["tokenizer.ggml.scores"], [score for _, score in tokenizer["model"]["vocab"]])
    types = fields["tokenizer.ggml.token_type"]
    assert types[:4] == [2, 3, 3, 3] and types[4:260] == [6] * 256 and set(types[260:]) == {1}
    assert fields["tokenizer.ggml.add_space_prefix"] is False and fields["tokenizer.ggml.add_bos_token"] is False
    assert fields["tokenizer.ggml.eos_token_id"] == 3 and "{%- generation" not in fields["tokenizer.chat_template"]
    model = HitobanForCausalLM.from_pretrained(tiny_model_dir).eval()
    state, heads = model.state_dict(), model.config.num_attention_heads
    q, k, v = state["model.layers.1.self_attn.qkv_proj.weight"].chunk(3)
    # GGUF stores shapes reversed (ne0 first); data is row-major as in torch
    assert np.array_equal(tensors["blk.1.attn_v.weight"].data, v.numpy())
    assert np.array_equal(tensors["blk.1.attn_q.weight"].data, _permute_for_rope(q, heads).numpy())
    assert not np.array_equal(tensors["blk.1.attn_q.weight"].data, q.numpy())  # the permutation is not a no-op
    assert np.array_equal(tensors["token_embd.weight"].data, state["model.embed_tokens.weight"].numpy())
    assert "output.weight" not in tensors  # tied: llama.cpp reuses token_embd


def test_export_gguf_q8_0_quantizes_matrices_and_refuses_to_overwrite(tmp_path, tiny_model_dir):
    report = export_gguf(tiny_model_dir, tmp_path / "q.gguf", "q8_0")
    f32 = export_gguf(tiny_model_dir, tmp_path / "f.gguf", "f32")
    assert report["bytes"] < f32["bytes"] / 3
    _, tensors = _reader(tmp_path / "q.gguf")
    assert tensors["blk.0.ffn_down.weight"].tensor_type.name == "Q8_0"
    assert tensors["output_norm.weight"].tensor_type.name == "F32"
    with pytest.raises(FileExistsError):
        export_gguf(tiny_model_dir, tmp_path / "q.gguf", "q8_0")


def _convert_script() -> Path | None:
    root = fetch(LLAMA_CPP_PYTHON, ("vendor/llama.cpp/convert_hf_to_gguf.py", "vendor/llama.cpp/conversion/",
                                    "vendor/llama.cpp/gguf-py/"), "llama-cpp-python-0.3.36-convert")
    return None if root is None else root / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"


@pytest.fixture(scope="module")
def converted(pretrained, tmp_path_factory) -> tuple[Path, Path]:
    """(llama.cpp's convert_hf_to_gguf.py output on `hitoban export-llama`, `hitoban export-gguf` output)."""
    script = _convert_script()
    if script is None:
        pytest.skip("llama-cpp-python's source archive (llama.cpp's converter) could not be fetched: no registry")
    out = tmp_path_factory.mktemp("gguf")
    assert main(["export-llama", str(pretrained), str(out / "llama")]) == 0
    done = subprocess.run([sys.executable, str(script), str(out / "llama"), "--outfile", str(out / "converted.gguf"),
                           "--outtype", "f32"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    export_gguf(pretrained, out / "ours.gguf", "f32")
    return out / "converted.gguf", out / "ours.gguf"


@pytest.mark.slow
def test_llama_cpp_converter_reads_export_llama_as_export_gguf_writes_it(converted):
    theirs, ours = _reader(converted[0]), _reader(converted[1])
    assert (theirs[0]["tokenizer.ggml.model"], ours[0]["tokenizer.ggml.model"]) == ("llama", "t5")
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.add_bos_token",
                "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id", "llama.rope.dimension_count",
                "llama.attention.head_count", "llama.context_length", "tokenizer.chat_template"):
        assert theirs[0][key] == ours[0][key], key
    assert np.allclose(theirs[0]["tokenizer.ggml.scores"], ours[0]["tokenizer.ggml.scores"])
    # the converter writes add_space_prefix only when tokenizer_config.json says add_prefix_space (export-llama does)
    assert theirs[0]["tokenizer.ggml.add_space_prefix"] is False
    assert theirs[1].keys() == ours[1].keys()
    for name, tensor in ours[1].items():
        assert np.array_equal(theirs[1][name].data, tensor.data), name


@pytest.mark.slow
@pytest.mark.parametrize("outtype,exact_tokens,logit_atol", [("f32", 20, 1e-4), ("q8_0", 5, 0.25)])
def test_llama_cpp_tokenizes_and_generates_as_transformers(pretrained, heldout, tmp_path, outtype, exact_tokens,
                                                             logit_atol):
    pytest.importorskip("llama_cpp", reason="llama.cpp runs only where pip install 'hitoban[llama]' was done")
    from hitoban.modeling.export_gguf import compare_with_llama_cpp

    export_gguf(pretrained, tmp_path / "m.gguf", outtype)
    report = compare_with_llama_cpp(tmp_path / "m.gguf", pretrained, heldout[:50], CHAT_PROMPT, new_tokens=20)
    print(outtype, {k: v for k, v in report.items() if not k.startswith("greedy_") or k == "greedy_equal_prefix"})
    assert report["texts_equal"] + report["texts_equal_but_unknown_characters"] == report["texts"]
    assert report["texts_equal"] >= 10 and report["prompt_tokenized_equal"]
    assert report["greedy_equal_prefix"] >= exact_tokens, report
    assert report["max_abs_logit_diff"] <= logit_atol and report["logit_positions"] > 50


@pytest.mark.slow
def test_llama_cpp_on_the_converters_file_same_weights_other_tokenizer(pretrained, heldout, converted):
    """convert_hf_to_gguf.py's file computes the same function (greedy tokens from the same prompt ids equal), but
    it types a SentencePiece vocabulary as llama.cpp's SentencePiece-BPE tokenizer, which segments a unigram
    vocabulary differently: the reason `hitoban export-gguf` writes the unigram type. Also the negative control that
    the tokenization comparison can fail."""
    pytest.importorskip("llama_cpp", reason="llama.cpp runs only where pip install 'hitoban[llama]' was done")
    from hitoban.modeling.export_gguf import compare_with_llama_cpp

    theirs = compare_with_llama_cpp(converted[0], pretrained, heldout[:50], CHAT_PROMPT, new_tokens=20)
    ours = compare_with_llama_cpp(converted[1], pretrained, heldout[:50], CHAT_PROMPT, new_tokens=20)
    print("converter", theirs["texts_equal"], "export-gguf", ours["texts_equal"], "of", ours["texts"])
    assert theirs["greedy_llama_cpp"] == ours["greedy_llama_cpp"] == ours["greedy_transformers"]
    assert theirs["texts_equal"] + theirs["texts_equal_but_unknown_characters"] < ours["texts"] // 2


@pytest.mark.slow
def test_llama_cpp_negative_control_a_dummy_prefix_breaks_tokenization(pretrained, heldout, tmp_path, monkeypatch):
    """The comparison can fail: the same GGUF with llama.cpp's default add_space_prefix tokenizes differently."""
    pytest.importorskip("llama_cpp", reason="llama.cpp runs only where pip install 'hitoban[llama]' was done")
    import gguf

    from hitoban.modeling.export_gguf import compare_with_llama_cpp

    original = gguf.GGUFWriter.add_add_space_prefix
    monkeypatch.setattr(gguf.GGUFWriter, "add_add_space_prefix", lambda self, value: original(self, True))
    export_gguf(pretrained, tmp_path / "bad.gguf", "f32")
    report = compare_with_llama_cpp(tmp_path / "bad.gguf", pretrained, heldout[:50], CHAT_PROMPT, new_tokens=5)
    assert report["texts_equal"] + report["texts_equal_but_unknown_characters"] < report["texts"] // 2
    # and `export-gguf --verify` refuses such a file and leaves nothing behind
    with pytest.raises(CheckFailed, match="tokenizes text differently"):
        export_gguf(pretrained, tmp_path / "refused.gguf", "f32", verify=True)
    assert not list(tmp_path.glob("refused*")) and not list(tmp_path.glob(".refused*"))


def test_transformers_reads_the_llama_export_tokenizer_unchanged(tmp_path, tiny_model_dir, heldout):
    from transformers import AutoTokenizer

    from hitoban.modeling.export_llama import export_llama

    export_llama(tiny_model_dir, tmp_path / "llama")
    assert (tmp_path / "llama" / "tokenizer.model").exists()
    ours, exported = AutoTokenizer.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tmp_path / "llama")
    texts = [*heldout[:50], CHAT_PROMPT]
    assert [ours(t)["input_ids"] for t in texts] == [exported(t)["input_ids"] for t in texts]
    messages = [{"role": "user", "content": "やあ"}, {"role": "assistant", "content": "こんにちは"}]
    assert ours.apply_chat_template(messages, tokenize=False) == exported.apply_chat_template(messages, tokenize=False)


def test_gguf_rope_permutation_matches_llama_cpp_convention():
    """Independent check of the permutation on a hand-sized case: head_dim 4 rows (0,1,2,3) = rotate-half pairs
    (0,2) and (1,3) become interleaved rows (0,2,1,3)."""
    rows = torch.arange(8.0)[:, None]  # 2 heads x head_dim 4
    assert _permute_for_rope(rows, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_missing_optional_packages_are_named_and_nothing_is_written(tmp_path, tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as where hitoban[llama] is not installed
    assert main(["export-gguf", str(tiny_model_dir), str(tmp_path / "m.gguf"), "--verify"]) == 2
    assert "pip install 'hitoban[llama]'" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "gguf", None)
    assert main(["export-gguf", str(tiny_model_dir), str(tmp_path / "m.gguf")]) == 2
    assert "pip install 'hitoban[gguf]'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_cli_offers_exactly_the_weight_types_the_exporter_writes():
    from hitoban.cli import build_parser
    from hitoban.modeling.export_gguf import OUTTYPES

    sub = next(a for a in build_parser()._actions if a.dest == "verb").choices["export-gguf"]
    assert tuple(next(a for a in sub._actions if a.dest == "outtype").choices) == OUTTYPES
