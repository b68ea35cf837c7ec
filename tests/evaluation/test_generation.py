"""3LM's generation metrics and the decode loop (evaluation/generation.py): hand-checked scores, sampling rules,
seeded replies, the questions file and `hitoban eval gen`."""

from __future__ import annotations

import json

import pytest
import torch

from hitoban.cli import main
from hitoban.modeling.loading import load_model_and_tokenizer


def test_scores_reproduce_hand_checked_values():
    from hitoban.evaluation.generation import score_replies

    items = [{"id": "a", "turns": ["こんにちは"], "keywords": None},
             {"id": "b", "turns": ["日本の首都はどこですか"], "keywords": ["東京", "首都"]},
             {"id": "c", "turns": ["猫について教えてください"], "keywords": ["猫"]},
             {"id": "d", "turns": ["疲れました"], "keywords": ["疲", "休"]}]
    replies = ["あいうあいうあいう", "東京です。日本の首都です。", "はい", "ゆっくり休んでください。" * 3]
    scored = score_replies(items, replies, [False, False, False, True])
    flags = [(r["repetition"], r["broken"], r["keyword_hit"]) for r in scored["results"]]
    # a: "あいう" x3 in 9 chars -> repetition; c: 2 chars -> broken, no 猫; d: truncated -> broken, and it repeats
    assert flags == [(True, False, None), (False, False, True), (False, True, False), (True, True, True)]
    assert scored["repetition_rate"] == 0.5 and scored["broken_rate"] == 0.5
    assert scored["topic_rate"] == round(2 / 3, 3)
    assert scored["avg_reply_len"] == round((9 + 13 + 2 + 36) / 4, 1)


def test_penalty_counts_only_generated_tokens_and_top_k_keeps_ties():
    from hitoban.evaluation.generation import GeneratedTokenPenalty, TopKKeepTies

    scores = torch.tensor([[2.0, -2.0, 1.0, 4.0]])
    ids = torch.tensor([[0, 1, 2, 1]])  # prompt = [0, 1]; generated = [2, 1]
    out = GeneratedTokenPenalty(prompt_length=2, penalty=2.0)(ids, scores.clone())
    assert out.tolist() == [[2.0, -4.0, 0.5, 4.0]]  # token 0 was only in the prompt: untouched
    assert GeneratedTokenPenalty(prompt_length=4, penalty=2.0)(ids, scores.clone()).tolist() == scores.tolist()
    tied = TopKKeepTies(2)(None, torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.0]]))
    assert torch.isfinite(tied).tolist() == [[False, True, True, True, False]]


def test_same_seed_and_prompts_give_identical_replies(tiny_model_dir):
    from hitoban.evaluation.generation import generation_metrics

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    items = [{"id": "x", "turns": ["こんにちは"]}, {"id": "y", "turns": ["猫を飼っています", "名前は？"],
                                                   "keywords": ["猫"]}]
    runs = [generation_metrics(model, tok, items, {"max_new_tokens": 24}) for _ in range(2)]
    assert [r["reply"] for r in runs[0]["results"]] == [r["reply"] for r in runs[1]["results"]]
    assert runs[0]["sampling"]["seed"] == 777 and runs[0]["sampling"]["top_k"] == 40
    other = generation_metrics(model, tok, items, {"max_new_tokens": 24, "seed": 1})
    assert [r["reply"] for r in other["results"]] != [r["reply"] for r in runs[0]["results"]]


def test_questions_file_errors_name_the_line(tmp_path):
    from hitoban.evaluation.generation import QuestionsError, load_questions

    bad = tmp_path / "q.jsonl"
    bad.write_text('{"id": "a", "turns": ["こんにちは"]}\n{"id": "b", "turns": []}\n', encoding="utf-8")
    with pytest.raises(QuestionsError, match=r"q\.jsonl:2: needs a non-empty list"):
        load_questions(bad)
    bad.write_text('{"id": "a", "turns": ["x"]}\n{oops\n', encoding="utf-8")
    with pytest.raises(QuestionsError, match=r"q\.jsonl:2: not valid JSON"):
        load_questions(bad)


@pytest.mark.slow
def test_eval_gen_cli_writes_replies_and_compares(tiny_model_dir, corpus, tmp_path, capsys):
    from hitoban.evaluation.generation import compare

    questions = tmp_path / "q.jsonl"
    lines = (corpus / "3lm-eval" / "questions.jsonl").read_text(encoding="utf-8").splitlines()
    questions.write_text("\n".join(lines[4:5] + lines[-1:]) + "\n", encoding="utf-8")  # fact_1 and ctx_4
    assert main(["eval", "gen", str(tiny_model_dir), "--questions", str(questions), "--out",
                 str(tmp_path / "gen.json")]) == 0
    result = json.loads((tmp_path / "gen.json").read_text())
    assert [r["id"] for r in result["results"]] == ["fact_1", "ctx_4"] and all("reply" in r for r in result["results"])
    assert result["model"] == tiny_model_dir.name
    better = dict(result, repetition_rate=result["repetition_rate"] - 0.1, broken_rate=result["broken_rate"] + 0.2)
    lines = compare(better, result)
    assert any("repetition_rate" in line and "better" in line for line in lines)
    assert any("broken_rate" in line and "worse" in line for line in lines)
    assert main(["eval", "gen", str(tiny_model_dir), "--questions", str(questions), "--out",
                 str(tmp_path / "gen2.json"), "--compare", str(tmp_path / "gen.json")]) == 0
    assert "unchanged" in capsys.readouterr().out  # same seeds, same model: nothing moved


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_lean_decode_loop_gives_generates_tokens_greedy_and_seeded(tiny_model_dir, dtype):
    """`decode` (chat, eval gen) must equal `model.generate` token for token: greedy, and sampled with the same
    seed through 3LM's processors (penalty, temperature, top-k with ties); in fp32 and in bf16 (`chat`'s weights
    where the CPU has bf16)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hitoban.evaluation.generation import SAMPLING, decode, sampling_processors

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval().to(dtype)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok.apply_chat_template([{"role": "user", "content": "雨の日は何をしますか"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    stops = [tok.convert_tokens_to_ids("<|end|>")]
    compared = 0
    for temperature in (0.0, 0.8, 1.5):
        settings = {**SAMPLING, "temperature": temperature}
        for seed in (1, 2, 3):
            processors, flags = sampling_processors(ids.shape[1], settings)
            torch.manual_seed(seed)
            ours = decode(model, ids, processors, flags["do_sample"], stops, 40)
            processors, flags = sampling_processors(ids.shape[1], settings)
            torch.manual_seed(seed)
            theirs = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40,
                                    logits_processor=processors, eos_token_id=stops, pad_token_id=stops[0], **flags)
            assert torch.equal(ours, theirs), (temperature, seed)
            compared += ours.shape[1] - ids.shape[1]
    assert compared > 100  # random weights rarely stop early: the comparison covered real decoding
    # negative control: another seed gives other samples, so equality above was not trivially true
    processors, flags = sampling_processors(ids.shape[1], {**SAMPLING, "temperature": 1.5})
    torch.manual_seed(99)
    assert not torch.equal(decode(model, ids, processors, True, stops, 40), theirs)
