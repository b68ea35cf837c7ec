"""Chat SFT and tone: data readers and filters, the loss mask and its controls, Trainer runs, chat CLI, README."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from hitoban.chat import Utf8SafeStreamer, chat_loop
from hitoban.cli import main
from hitoban.errors import MissingInputError
from hitoban.training.data.chat import ChatDataError, ChatFilter, ChatFilterSettings, read_conversations
from hitoban.training.finetune.options import FinetuneOptions
from hitoban.training.finetune.sft import CheckedCollator, MaskError, build_example, check_mask, finetune


@pytest.fixture(scope="module")
def chats(corpus, tmp_path_factory) -> Path:
    """400 real multi-turn chats (RealPersonaChat, CC BY-SA), cut to 4 turns each."""
    out = tmp_path_factory.mktemp("chats") / "chats.jsonl"
    lines = (corpus / "dialogue" / "real-persona-chat.messages.jsonl").read_text(encoding="utf-8").splitlines()
    with open(out, "w", encoding="utf-8") as f:
        for line in lines[:400]:
            f.write(json.dumps({"messages": json.loads(line)["messages"][:4]}, ensure_ascii=False) + "\n")
    return out


# ------------------------------------------------------------------------------------------------ data

def test_every_chat_format_is_read(tmp_path):
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "やあ"}, {"role": "assistant", "content": "こんにちは"},
                                 {"role": "user", "content": "元気？"}, {"role": "assistant", "content": "元気です"}]},
                   ensure_ascii=False) + "\n" + json.dumps({"user": "質問", "assistant": "回答です"}) + "\n",
        encoding="utf-8")
    (tmp_path / "b.tsv").write_text("おはよう\tおはようございます\n", encoding="utf-8")
    (tmp_path / "c.txt").write_text("<|user|>Q1<|assistant|>A1です<|end|><|user|>Q2<|assistant|>A2です<|end|>\n",
                                    encoding="utf-8")
    conversations, info = read_conversations([tmp_path / "a.jsonl", tmp_path / "b.tsv", tmp_path / "c.txt"])
    assert [len(c) for c in conversations] == [4, 2, 2, 4] and info["bad_lines"] == 0
    assert conversations[3][3] == {"role": "assistant", "content": "A2です"}


@pytest.mark.parametrize("line, message", [
    ("{broken", r"bad\.jsonl:2: not valid JSON"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}]}), r"bad\.jsonl:2: no assistant turn"),
    (json.dumps({"messages": [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]}),
     r"bad\.jsonl:2: roles out of order"),
])
def test_bad_lines_are_named_or_skipped_with_a_count(tmp_path, line, message):
    good = json.dumps({"user": "こんにちは", "assistant": "こんにちは！"}, ensure_ascii=False)
    (tmp_path / "bad.jsonl").write_text(good + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ChatDataError, match=message):
        read_conversations([tmp_path / "bad.jsonl"])
    conversations, info = read_conversations([tmp_path / "bad.jsonl"], skip_bad=True)
    assert len(conversations) == 1 and info["bad_lines"] == 1


def test_empty_file_is_an_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(ChatDataError, match="empty.jsonl: no conversations"):
        read_conversations([tmp_path / "empty.jsonl"])


def test_filters_and_holdout_exclusion_remove_planted_near_duplicates():
    held_answer = "富士山は日本で一番高い山で、標高は三千七百七十六メートルあり、山梨県と静岡県にまたがっています。"
    holdout = [("日本で一番高い山は？", held_answer)]
    near_copy = "はい。" + held_answer[:45] + "とても有名です。"  # shares a 45-char window, edited around it
    conv = [
        [{"role": "user", "content": "日本で一番高い山は？"}, {"role": "assistant", "content": held_answer}],  # exact
        [{"role": "user", "content": "有名な山は？"}, {"role": "assistant", "content": near_copy}],  # window
        [{"role": "user", "content": "こんにちは"}, {"role": "assistant", "content": "こんにちは"}],  # user == answer
        [{"role": "user", "content": "短い"}, {"role": "assistant", "content": "はい"}],  # answer too short
        [{"role": "user", "content": "猫は好き？"}, {"role": "assistant", "content": "大好きです。毎日なでています。"}],
        [{"role": "user", "content": "猫は好き？"}, {"role": "assistant", "content": "大好きです。毎日なでています。"}],
    ]
    chat_filter = ChatFilter(ChatFilterSettings(min_char_freq=1), holdout)
    kept = chat_filter.apply(conv)
    assert kept == [conv[4]]
    assert dict(chat_filter.rejected) == {"holdout_exact": 1, "holdout_window": 1, "broken_translation": 1,
                                          "length": 1, "duplicate": 1}


# ------------------------------------------------------------------------------------------------ mask

def test_check_mask_passes_and_its_negative_controls_fail(pretrained):
    tok = AutoTokenizer.from_pretrained(pretrained)
    assert check_mask(tok, log=lambda *_: None)
    assert not check_mask(tok, corruption="shift", log=lambda *_: None)
    assert not check_mask(tok, corruption="drop_end", log=lambda *_: None)
    assert main(["check-mask", "--tokenizer", str(pretrained)]) == 0
    assert main(["check-mask", "--tokenizer", str(pretrained), "--control", "shift"]) == 1


def test_multi_turn_labels_cover_every_assistant_turn_and_its_end(pretrained):
    tok = AutoTokenizer.from_pretrained(pretrained)
    messages = [{"role": "user", "content": "猫を飼っています"}, {"role": "assistant", "content": "いいですね"},
                {"role": "user", "content": "名前は？"}, {"role": "assistant", "content": "タマです"}]
    ex = build_example(tok, messages)
    counted = tok.decode([i for i, label in zip(ex["input_ids"], ex["labels"]) if label != -100])
    assert counted == "いいですね<|end|>タマです<|end|>"


def test_masked_positions_carry_no_gradient(pretrained):
    tok = AutoTokenizer.from_pretrained(pretrained)
    model = AutoModelForCausalLM.from_pretrained(pretrained)
    ex = build_example(tok, [{"role": "user", "content": "今日は寒いですね"},
                             {"role": "assistant", "content": "そうですね、暖かくしてください。"}])
    ids, labels = torch.tensor([ex["input_ids"]]), torch.tensor([ex["labels"]])
    from hitoban.modeling.modeling_hitoban import causal_lm_loss  # the loss the model applies to `labels`

    logits = model(ids).logits
    logits.retain_grad()
    causal_lm_loss(logits, labels).backward()
    predicts_counted = (labels[0, 1:] != -100).tolist() + [False]  # position t predicts token t+1
    row_norms = logits.grad[0].abs().sum(-1)
    for t, counted in enumerate(predicts_counted):
        assert (row_norms[t] > 0) == counted


def test_collator_refuses_all_ignored_and_all_counted_batches(pretrained):
    tok = AutoTokenizer.from_pretrained(pretrained)
    collator = CheckedCollator(tok, label_pad_token_id=-100)
    ex = build_example(tok, [{"role": "user", "content": "やあ"}, {"role": "assistant", "content": "こんにちは"}])
    assert collator([ex])["labels"].shape[0] == 1
    with pytest.raises(MaskError, match="no counted token"):
        collator([{**ex, "labels": [-100] * len(ex["labels"])}])
    with pytest.raises(MaskError, match="counts every token"):
        collator([{**ex, "labels": list(ex["input_ids"])}])


# ------------------------------------------------------------------------------------------------ Trainer runs

@pytest.mark.slow
def test_sft_lowers_validation_loss_and_resumes(pretrained, chats, tmp_path, corpus, caplog):
    from transformers.utils import logging as hf_logging

    hf_logging.enable_propagation()  # the Trainer's warnings reach caplog
    common = dict(base=str(pretrained), data=[str(chats)], out=str(tmp_path / "sft"), lr=3e-3, batch_size=16,
                  eval_steps=10, val_frac=0.1, max_user_chars=200, max_assistant_chars=300, min_char_freq=1,
                  exclude=[str(corpus / "3lm-eval" / "holdout_clean.txt")])
    summary = finetune(FinetuneOptions(max_steps=30, report_to="tensorboard", **common), log=lambda *_: None)
    assert summary["conversations"] > 300 and 0.3 < summary["counted_ratio"] < 0.7
    assert summary["best_val_loss"] < summary["first_val_loss"] - 0.3 and not summary["resumed"]
    assert "missing keys" not in caplog.text  # the tied lm_head is re-tied when the best checkpoint is reloaded
    saved = json.loads((tmp_path / "sft" / "summary.json").read_text())
    assert saved["best_step"] == summary["best_step"] and str(tmp_path) not in json.dumps(saved)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "sft")
    tok = AutoTokenizer.from_pretrained(tmp_path / "sft")
    assert tok.chat_template and model.config.model_type == "hitoban"
    again = finetune(FinetuneOptions(max_steps=40, report_to="tensorboard", **common), log=lambda *_: None)
    assert again["resumed"] and again["steps"] == 40
    # --report-to tensorboard: the Trainer's own evaluations, both sessions in one TensorBoard run in --out
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "sft" / "tensorboard"), size_guidance={"scalars": 0}).Reload()
    board = {e.step: e.value for e in events.Scalars("eval/loss")}
    state = json.loads(max((tmp_path / "sft" / "trainer").glob("checkpoint-*/trainer_state.json"),
                           key=lambda p: int(p.parent.name.split("-")[1])).read_text())
    history = {h["step"]: h["eval_loss"] for h in state["log_history"] if "eval_loss" in h}
    assert sorted(board) == sorted(history) == [10, 20, 30, 40]
    assert all(board[step] == pytest.approx(history[step], rel=1e-6) for step in history)


def test_an_existing_out_is_refused_unless_it_is_this_fine_tune(pretrained, chats, tmp_path):
    """Issue 25: --out equal to the base, another run's folder, or an earlier fine-tune of other data is refused
    before anything is written; nothing there changes."""
    from hitoban.errors import OutputExistsError
    from hitoban.provenance import weights_sha256

    before = weights_sha256(pretrained)
    with pytest.raises(OutputExistsError, match="is the base model itself"):
        finetune(FinetuneOptions(base=str(pretrained), data=[str(chats)], out=str(pretrained), max_steps=1),
                 log=lambda *_: None)
    assert weights_sha256(pretrained) == before and not (pretrained / "finetune.json").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"someone's model")
    with pytest.raises(OutputExistsError, match="holds no sft of this base"):
        finetune(FinetuneOptions(base=str(pretrained), data=[str(chats)], out=str(other), max_steps=1),
                 log=lambda *_: None)
    assert (other / "model.safetensors").read_bytes() == b"someone's model"
    earlier = tmp_path / "earlier"  # an earlier fine-tune's record, made from other data
    earlier.mkdir()
    fewer = tmp_path / "fewer.jsonl"
    fewer.write_text("".join(chats.read_text(encoding="utf-8").splitlines(keepends=True)[:50]), encoding="utf-8")
    options = FinetuneOptions(base=str(pretrained), data=[str(fewer)], out=str(earlier), max_steps=1)
    from hitoban.training.finetune.sft import RECORD, claim_output, fine_tune_record

    claim_output(options, fine_tune_record(options))
    with pytest.raises(OutputExistsError, match="different data_sha256"):
        finetune(FinetuneOptions(base=str(pretrained), data=[str(chats)], out=str(earlier), max_steps=1),
                 log=lambda *_: None)
    assert json.loads((earlier / RECORD).read_text())["data_sha256"] == fine_tune_record(options)["data_sha256"]
    with pytest.raises(MissingInputError, match="given to --exclude"):
        finetune(FinetuneOptions(base=str(pretrained), data=[str(chats)], out=str(tmp_path / "new"),
                                 exclude=[str(tmp_path / "missing.txt")]), log=lambda *_: None)


def test_tone_cli_and_a_base_without_template(pretrained, tmp_path):
    tone = tmp_path / "tone.jsonl"
    replies = ["まじそれな〜！", "やばくない？", "うける〜", "それめっちゃいいじゃん！", "えー、ほんとに？"]
    tone.write_text("\n".join(json.dumps({"user": f"質問{i}ですか？", "assistant": replies[i % 5] + "だよ〜"},
                                         ensure_ascii=False) for i in range(60)) + "\n", encoding="utf-8")
    assert main(["tone", str(pretrained), "--data", str(tone), "--out", str(tmp_path / "tone"), "--max-steps", "6",
                 "--eval-steps", "3", "--batch-size", "8", "--val-frac", "0.2"]) == 0
    assert json.loads((tmp_path / "tone" / "summary.json").read_text())["stage"] == "tone"
    bare = tmp_path / "bare"
    AutoModelForCausalLM.from_pretrained(pretrained).save_pretrained(bare)
    with pytest.raises(MaskError, match="tokenizer and chat template"):
        finetune(FinetuneOptions(base=str(bare), data=[str(tone)], out=str(tmp_path / "x"), max_steps=1),
                 log=lambda *_: None)


# ------------------------------------------------------------------------------------------------ chat

def test_streamer_never_emits_half_a_character(pretrained):
    tok = AutoTokenizer.from_pretrained(pretrained)
    text = "絵文字😀と𠮷野家"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pieces: list[str] = []
    streamer = Utf8SafeStreamer(tok, pieces.append)
    streamer.put(torch.tensor([[1, 2]]))  # the prompt, ignored
    for i in ids:
        streamer.put(torch.tensor([i]))
    streamer.end()
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)
    assert len(ids) > len(text)  # byte fallback really happened


def test_chat_loop_commands_history_and_reset(pretrained):
    model = AutoModelForCausalLM.from_pretrained(pretrained)
    tok = AutoTokenizer.from_pretrained(pretrained)
    script = iter(["/temp 0", "/tokens 8", "こんにちは", "/settings", "/reset", "猫は好き？", "/exit"])
    output: list[str] = []
    history = chat_loop(model, tok, lambda: next(script), output.append)
    text = "".join(output)
    assert "(temperature = 0.0)" in text and "(max_new_tokens = 8)" in text and "(conversation reset)" in text
    assert text.count("assistant> ") == 2 and "temperature=0.0" in text
    assert [m["role"] for m in history] == ["user", "assistant"] and history[0]["content"] == "猫は好き？"


# ------------------------------------------------------------------------------------------------ README snippet

@pytest.mark.slow  # a Trainer run in a fresh interpreter (~7-11 s)
def test_readme_trainer_snippet_runs_as_written(pretrained, tmp_path):
    readme = (REPO / "docs" / "using.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Fine-tune a character tone with the Trainer"):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    tone = tmp_path / "tone.jsonl"
    tone.write_text("\n".join(json.dumps({"user": f"今日の予定{i}は？", "assistant": f"予定{i}はのんびりだよ〜"},
                                         ensure_ascii=False) for i in range(40)) + "\n", encoding="utf-8")
    (tmp_path / "snippet.py").write_text(code, encoding="utf-8")
    env = {**os.environ, "MODEL_DIR": str(pretrained), "TONE_DATA": str(tone), "OUT_DIR": str(tmp_path / "tone"),
           "HF_MODULES_CACHE": str(tmp_path / "modules")}
    run = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "tone" / "model.safetensors").exists() and (tmp_path / "tone" / "tokenizer.json").exists()


# ------------------------------------------------------------------------------------------------ LoRA (PEFT)

def test_llama_style_lora_targets_are_refused_with_hitobans_names(tiny_model):
    from peft import LoraConfig, get_peft_model

    from hitoban.errors import UsageError
    from hitoban.training.finetune.lora import HITOBAN_TARGETS, check_targets

    llama_names = ["q_proj", "k_proj", "v_proj", "o_proj"]
    with pytest.raises(UsageError, match=r"q_proj, v_proj.*Llama's names.*qkv_proj"):
        check_targets(tiny_model, llama_names)
    check_targets(tiny_model, HITOBAN_TARGETS)
    # the trap the check exists for: PEFT alone takes Llama's names and quietly adapts o_proj only
    adapted = get_peft_model(tiny_model, LoraConfig(target_modules=llama_names, task_type="CAUSAL_LM"))
    kinds = {name.split(".")[-1] for name, module in adapted.named_modules() if hasattr(module, "lora_A")}
    assert kinds == {"o_proj"}


def test_lora_tone_trains_saves_reloads_and_merges(pretrained, chats, tmp_path):
    from peft import AutoPeftModelForCausalLM

    from hitoban.training.finetune.options import ToneOptions

    out = tmp_path / "tone"
    summary = finetune(ToneOptions(base=str(pretrained), data=[str(chats)], out=str(out), max_steps=8, eval_steps=4,
                                   batch_size=8, lora=True, lora_r=8, lora_alpha=16, merge=True), quiet=True)
    assert summary["lora"]["targets"] == ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    assert (out / "adapter" / "adapter_config.json").exists() and (out / "model.safetensors").exists()
    ids = torch.tensor([[5, 17, 42, 7, 99, 3]])
    with torch.no_grad():
        adapter = AutoPeftModelForCausalLM.from_pretrained(out / "adapter").eval()
        merged = AutoModelForCausalLM.from_pretrained(out).eval()
        base = AutoModelForCausalLM.from_pretrained(pretrained).eval()
        via_adapter, via_merged, via_base = (m(ids).logits for m in (adapter, merged, base))
    assert (via_adapter - via_merged).abs().max() < 1e-5  # merging changes nothing the adapter computes
    assert (via_adapter - via_base).abs().max() > 1e-4  # and the adapter learned something (not a no-op)
    lineage = json.loads((out / "adapter" / "lineage.json").read_text()) if (
        out / "adapter" / "lineage.json").exists() else json.loads((out / "lineage.json").read_text())
    assert lineage["base"]["folder"] == pretrained.name


@settings(max_examples=30, deadline=None)
@given(st.sets(st.integers(min_value=1, max_value=10**6), min_size=1, max_size=12))
def test_the_checkpoint_resumed_is_the_one_with_the_highest_step(tmp_path_factory, steps):
    """Issue 34: `sorted(glob("checkpoint-*"))[-1]` sorted as text, so after step 999 a resume took checkpoint-900
    over checkpoint-1000. Any set of steps: the highest is resumed."""
    from hitoban.training.finetune.sft import last_checkpoint

    folder = tmp_path_factory.mktemp("trainer")
    for step in steps:
        (folder / f"checkpoint-{step}").mkdir()
    assert last_checkpoint(folder) == str(folder / f"checkpoint-{max(steps)}")
    assert last_checkpoint(folder / "none") is None


def test_cpu_means_the_cpu_where_a_gpu_or_mac_is_present(monkeypatch):
    """Issue 34: `hitoban demo --cpu` still fine-tuned on a GPU or MPS when one was there. With both reported
    present, --cpu trains on the CPU in fp32; without it (the control) the Trainer is not told to use the CPU."""
    from hitoban.training.device import hf_trainer_precision

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert hf_trainer_precision(cpu=True) == {"use_cpu": True, "bf16": False, "fp16": False}
    assert hf_trainer_precision(cpu=False)["use_cpu"] is False  # MPS: fp32 there (the device plan)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert hf_trainer_precision(cpu=True) == {"use_cpu": True, "bf16": False, "fp16": False}
