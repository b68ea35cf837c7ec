"""Evaluation: exact leak scanner (with its self-test and controls) and bits/char (docs/design.md §11, §13)."""

from __future__ import annotations

import json
import math
import shutil
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hitoban.cli import main
from hitoban.errors import InputError
from hitoban.evaluation.bpc import BpcError, bits_per_char, cross_domain, write_outputs
from hitoban.evaluation.leaks import LeakScanError, make_probes, scan_for_leaks, self_test
from hitoban.evaluation.matching import Matcher, scan_bytes_chunks
from hitoban.modeling.loading import load_model_and_tokenizer

HOLDOUT_LINE = ("<|user|>日本で一番高い山の名前とその標高はどれくらいですか？また、その山が位置している地域について"
                "教えてください。<|assistant|>日本で最も高い山は富士山で、標高は三千七百七十六メートルです。<|end|>")
FILLER = ("春の川べりを歩くと、水の音がいつもより明るく聞こえる。"
          "雪解けの水が山から下りてきて、石の間を急いで流れていく。")
ENGINES = ["sampled-grams", "hyperscan", "ahocorasick-rs"]


def test_probes_follow_the_3lm_construction():
    probes = make_probes([HOLDOUT_LINE, "短い行"])
    assert len(probes) == 3 and set(probes.values()) == {1}
    unmarked = HOLDOUT_LINE.replace("<|user|>", " ").replace("<|assistant|>", " ").replace("<|end|>", " ")
    clean = " ".join(unmarked.split())
    for probe in probes:
        assert probe in clean and "<|" not in probe and len(probe.encode()) >= 96 and len(probe) >= 48
    assert clean.startswith(next(iter(probes)))


@pytest.mark.parametrize("engine", ENGINES)
def test_self_test_passes_for_each_engine(engine):
    self_test(lambda patterns: Matcher(patterns, engine))


def test_self_test_fails_for_a_scanner_that_misses_chunk_borders():
    class WithinChunkOnly(Matcher):
        """Negative control: drops every match that needed the overlap carried from the previous chunk."""

        def find(self, data):
            return [(pid, end) for pid, end in super().find(data) if end - len(self.patterns[pid]) >= 95]

    with pytest.raises(LeakScanError, match="self-test failed"):
        self_test(lambda patterns: WithinChunkOnly(patterns, "ahocorasick-rs"))


@settings(max_examples=60, deadline=None)
@given(offset=st.integers(min_value=0, max_value=6000), chunk=st.integers(min_value=200, max_value=3000),
       engine=st.sampled_from(ENGINES))
def test_a_planted_probe_is_found_exactly_once_at_any_byte_offset(offset, chunk, engine):
    probe = next(iter(make_probes([HOLDOUT_LINE]))).encode()
    near_miss = probe[:-3] + "。".encode()  # differs in the last character only
    filler = (FILLER * 40).encode()
    data = filler[:offset] + probe + filler[offset:]
    matcher = Matcher([probe, near_miss], engine)
    counts, _ = scan_bytes_chunks((data[i : i + chunk] for i in range(0, len(data), chunk)), matcher)
    assert counts[0] == 1 and counts[1] == 0


def found_at_each_alignment(matcher) -> list[int]:
    probe = matcher.patterns[0]
    filler = (FILLER * 4).encode()
    return [len([1 for pid, _ in matcher.find(filler[:100 + shift] + probe + filler) if pid == 0])
            for shift in range(16)]


def test_sampled_grams_find_a_probe_at_every_alignment_and_the_control_does_not():
    from hitoban.evaluation.matching import SampledGrams

    probe = next(iter(make_probes([HOLDOUT_LINE]))).encode()
    assert found_at_each_alignment(Matcher([probe], "sampled-grams")) == [1] * 16

    matcher = Matcher([probe], "sampled-grams")  # negative control: keep only the grams at offset 0 of the probe
    matcher.grams.keys = {k: [(p, o) for p, o in v if o == 0] for k, v in matcher.grams.keys.items()}
    matcher.grams.keys = {k: v for k, v in matcher.grams.keys.items() if v}
    matcher.grams.sorted_keys = np.array(sorted(matcher.grams.keys), dtype=np.uint64)
    assert found_at_each_alignment(matcher) == [1 if shift % 8 == 4 else 0 for shift in range(16)]
    with pytest.raises(LeakScanError, match=">= 23 bytes"):
        SampledGrams([b"short"])


def test_scan_reports_affected_lines_and_the_cli_exits_1_on_a_leak(tmp_path, capsys):
    holdout = tmp_path / "holdout.txt"
    other = "<|user|>" + "全く別の質問で、ここには学習データに含まれない長い文章が続きます。" * 2 + "<|end|>"
    holdout.write_text(other + "\n" + HOLDOUT_LINE + "\n", encoding="utf-8")
    clean = tmp_path / "clean.txt"
    clean.write_text(FILLER * 100, encoding="utf-8")
    leaky = tmp_path / "leaky.txt"
    middle = HOLDOUT_LINE.replace("<|user|>", "").split("<|assistant|>")[0]
    leaky.write_text(FILLER * 50 + middle + FILLER * 50, encoding="utf-8")
    report = scan_for_leaks(holdout, [clean, leaky])
    assert report["leaked"] and report["corpora"][0]["hit_probes"] == 0
    assert report["corpora"][1]["affected_holdout_lines"] == [2] and report["corpora"][1]["hit_probes"] >= 1
    assert main(["leaks", "--holdout", str(holdout), "--corpus", str(clean), "--out", str(tmp_path / "r.json")]) == 0
    assert main(["leaks", "--holdout", str(holdout), "--corpus", str(clean), str(leaky)]) == 1
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["leaked"] is False and str(tmp_path) not in (tmp_path / "r.json").read_text()
    assert "LEAKED" in capsys.readouterr().out


def test_a_corpus_folder_is_scanned_through_json_escaping(tmp_path):
    """A quote inside the leaked text is escaped in documents.jsonl; the scan reads the decoded strings."""
    line = ("彼は「" + "これは引用を含む長い文で、" * 3 + '"quoted" と書いた。'
            + "検査のためにさらに文章を足しておきます。" * 2)
    holdout = tmp_path / "holdout.txt"
    holdout.write_text(line + "\n", encoding="utf-8")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "documents.jsonl").write_text(json.dumps({"text": FILLER + line, "source": "x"}, ensure_ascii=False)
                                            + "\n", encoding="utf-8")
    (corpus / "manifest.json").write_text(manifest_of((corpus / "documents.jsonl").read_bytes(), 1))
    assert '\\"quoted\\"' in (corpus / "documents.jsonl").read_text()
    report = scan_for_leaks(holdout, [corpus])
    assert report["leaked"] and report["corpora"][0]["hit_probes"] == 3


def holdout_dialogues(corpus) -> list[list[str]]:
    from hitoban.evaluation.leaks import split_turns

    lines = (corpus / "3lm-eval" / "holdout_clean.txt").read_text(encoding="utf-8").splitlines()
    return [split_turns(line) for line in lines if len(split_turns(line)) >= 2]


def test_held_out_dialogues_written_as_jsonl_messages_are_found(tmp_path, corpus):
    """Finding 3: probes cut from whole lines straddle turn boundaries, so a held-out chat stored as JSONL
    `messages` (the SFT format) was missed unless its turns were long. Every held-out dialogue of the 3LM clean
    holdout is planted into a chat file as JSONL; each one the plan can probe must be found, and the report must
    say which could not be probed."""
    dialogues = holdout_dialogues(corpus)
    holdout = tmp_path / "holdout.txt"
    holdout.write_text("".join("<|user|>" + "<|assistant|>".join(d) + "<|end|>\n" for d in dialogues),
                       encoding="utf-8")
    chats = [json.loads(line) for line in (corpus / "dialogue" / "real-persona-chat.messages.jsonl")
             .read_text(encoding="utf-8").splitlines()[:400]]
    for i, turns in enumerate(dialogues):
        roles = ["user", "assistant"] * len(turns)
        chats.insert(i * 2, {"messages": [{"role": r, "content": t} for r, t in zip(roles, turns)]})
    leaked = tmp_path / "chats.jsonl"
    leaked.write_text("".join(json.dumps(c, ensure_ascii=i % 2 == 0) + "\n" for i, c in enumerate(chats)),
                      encoding="utf-8")
    report = scan_for_leaks(holdout, [leaked])
    coverage, row = report["coverage"], report["corpora"][0]
    assert coverage["lines"] == len(dialogues) and coverage["probed_lines"] + coverage["unprobed_lines"] == len(
        dialogues)
    assert coverage["probed_lines"] >= len(dialogues) - 8, coverage  # the rest are greetings like やあ・こんにちは
    assert len(row["affected_holdout_lines"]) == coverage["probed_lines"]  # and every probed one is found
    # what line probes alone (the old scan) see in the same file: far fewer
    assert len(row["found_by"].get("line", [])) < coverage["probed_lines"] - 15, row["found_by"]
    clean = tmp_path / "clean.jsonl"
    clean.write_text("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in chats[len(dialogues) * 2:]),
                     encoding="utf-8")
    assert not scan_for_leaks(holdout, [clean])["leaked"]


def test_the_self_test_fails_for_a_scanner_blind_to_jsonl_or_to_short_turns(monkeypatch):
    from hitoban.evaluation import leaks

    factory = lambda patterns: Matcher(patterns, "sampled-grams")  # noqa: E731
    with monkeypatch.context() as patch:  # reads JSONL as raw bytes: escaped text hides the dialogue
        patch.setattr(leaks, "corpus_chunks", leaks._file_chunks)
        with pytest.raises(LeakScanError, match="dialogue of short turns"):
            self_test(factory)
    with monkeypatch.context() as patch:  # no whole-turn matching: a dialogue of short turns is never probed
        original = leaks.plan_probes

        def line_probes_only(*args, **kwargs):
            plan = original(*args, **kwargs)
            plan.chains.clear()
            return plan

        patch.setattr(leaks, "plan_probes", line_probes_only)
        with pytest.raises(LeakScanError, match="dialogue of short turns"):
            self_test(factory)
    self_test(factory)


def test_bad_leak_inputs_are_named(tmp_path):
    with pytest.raises(LeakScanError, match="holdout file not found"):
        scan_for_leaks(tmp_path / "nope.txt", [])
    short = tmp_path / "short.txt"
    short.write_text("短い\n", encoding="utf-8")
    with pytest.raises(LeakScanError, match="nothing to probe"):
        scan_for_leaks(short, [])
    holdout = tmp_path / "h.txt"
    holdout.write_text(HOLDOUT_LINE + "\n", encoding="utf-8")
    with pytest.raises(LeakScanError, match="missing.txt: no such corpus"):
        scan_for_leaks(holdout, [tmp_path / "missing.txt"])


def test_a_corpus_in_another_encoding_is_decoded_or_refused_never_clean(tmp_path, capsys):
    """Issue 25: a Shift_JIS or binary corpus was scanned as bytes and reported "no leak"; a Shift_JIS copy of the
    held-out file itself found 1 of its lines. Now such a file is refused with its byte offset, or decoded with
    --encoding and then found, and the report counts the bytes read as text."""
    holdout = tmp_path / "holdout.txt"
    holdout.write_text(HOLDOUT_LINE + "\n", encoding="utf-8")
    copy = tmp_path / "copy-sjis.txt"
    copy.write_text(FILLER * 20 + HOLDOUT_LINE + "\n" + FILLER * 20, encoding="shift_jis")
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    for corpus in (copy, binary):
        with pytest.raises(LeakScanError, match=r"not valid utf-8 text at byte offset \d+.*--encoding"):
            scan_for_leaks(holdout, [corpus])
    report = scan_for_leaks(holdout, [copy], encoding="shift_jis")
    row = report["corpora"][0]
    assert report["leaked"] and row["affected_holdout_lines"] == [1]
    assert row["text_bytes"] == copy.stat().st_size and row["encoding"] == "shift_jis"
    assert main(["leaks", "--holdout", str(holdout), "--corpus", str(copy)]) == 2
    assert "byte offset" in capsys.readouterr().err
    assert main(["leaks", "--holdout", str(holdout), "--corpus", str(copy), "--encoding", "shift_jis"]) == 1
    assert main(["leaks", "--holdout", str(holdout), "--corpus", str(copy), "--encoding", "klingon"]) == 2
    sjis_holdout = tmp_path / "holdout-sjis.txt"  # the held-out file itself in another encoding: refused by name
    sjis_holdout.write_text(HOLDOUT_LINE + "\n", encoding="shift_jis")
    with pytest.raises(InputError, match="holdout-sjis.txt: not valid utf-8 at byte offset"):
        scan_for_leaks(sjis_holdout, [copy])


# ------------------------------------------------------------------------------------------------ bits per char

def test_bits_per_char_by_hand_on_a_short_text(tiny_model_dir):
    """The definition written out token by token, independently of the batched windows: token i is predicted from
    <|end|> + the tokens before it in its window of 4; marker tokens are not scored; the characters are counted by
    hand: 吾輩は猫である。 (8) + 名前はまだ無い。 (8) = 16, the markers are not characters of the text."""
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    text = "吾輩は猫である。<|user|>名前はまだ無い。<|end|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    markers = set(tok.convert_tokens_to_ids(["<|user|>", "<|end|>"]))
    sequence = [tok.convert_tokens_to_ids("<|end|>")] + ids
    nats = 0.0
    with torch.no_grad():
        for i, target in enumerate(ids):
            window_start = (i // 4) * 4
            logits = model(torch.tensor([sequence[window_start : i + 1]])).logits[0, -1].double()
            if target not in markers:
                nats -= torch.log_softmax(logits, -1)[target].item()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a short text is flagged; the value is still defined
        result = bits_per_char(model, tok, text, "hand", window=4)
        whole = bits_per_char(model, tok, text, "hand", window=256)
    assert result["chars"] == 16 and result["marker_tokens"] == 2 and result["tokens"] == len(ids)
    assert result["windows"] == -(-len(ids) // 4) and len(ids) % 4  # a shorter last window is scored too
    assert abs(result["bits_per_char"] - nats / math.log(2) / 16) < 1e-6
    # every token is scored once whatever the window: a window longer than the text gives the same definition
    # (up to the context each token sees), and the characters are the same 16
    assert whole["chars"] == 16 and whole["scored_tokens"] == result["scored_tokens"]


def test_bits_per_char_on_a_long_text_is_near_uniform_for_a_random_model(tiny_model_dir, corpus):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    text = (corpus / "3lm-eval" / "holdout_clean.txt").read_text(encoding="utf-8")[:20_000]
    result = bits_per_char(model, tok, text, "dialogue")
    assert result["windows"] >= 8 and "warning" not in result
    assert result["chars"] == len(text) - sum(text.count(m) * len(m) for m in ("<|user|>", "<|assistant|>", "<|end|>"))
    uniform = math.log2(len(tok)) * result["scored_tokens"] / result["chars"]  # a random model is near uniform
    assert 0.8 * uniform < result["bits_per_char"] < 1.3 * uniform


def test_short_and_missing_domains_are_reported_not_averaged(tiny_model_dir, tmp_path):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    with pytest.warns(UserWarning, match="too short for a stable estimate"):
        short = bits_per_char(model, tok, FILLER * 12, "short")
    assert short["windows"] < 8 and "warning" in short
    with pytest.raises(BpcError, match="empty"):
        bits_per_char(model, tok, "  \n", "blank")
    with pytest.raises(BpcError, match="only chat markers"):
        bits_per_char(model, tok, "<|user|><|end|>", "markers")
    with pytest.raises(BpcError, match="not found"):
        cross_domain([tiny_model_dir], {"web": tmp_path / "nope.txt"})
    no_tok = tmp_path / "model-only"
    model.save_pretrained(no_tok)
    with pytest.raises(InputError, match="no tokenizer.json"):
        load_model_and_tokenizer(no_tok)


def test_shard_domains_are_whole_documents(tiny_shards):
    from hitoban.training.data.reader import ShardReader

    reader = ShardReader(tiny_shards, "val")
    for cap in (50, 3000):
        for documents in reader.domain_documents(cap).values():
            assert all(doc[-1] == reader.end_id and (doc[:-1] != reader.end_id).all() for doc in documents)
            assert len(documents) == 1 or sum(map(len, documents)) <= cap


def test_cross_domain_table_json_markdown_png(tiny_model_dir, corpus, tmp_path, tiny_shards, pretrained):
    literature = sorted((corpus / "literature").glob("0*.txt"))[-1]
    assert main(["eval", "bpc", str(tiny_model_dir), "--domain", f"literature={literature}", "--domain",
                 f"dialogue={corpus / '3lm-eval' / 'holdout_clean.txt'}", "--max-chars", "30000", "--out",
                 str(tmp_path / "bpc.json")]) == 0
    result = json.loads((tmp_path / "bpc.json").read_text())
    assert {r["domain"] for r in result["records"]} == {"literature", "dialogue"}
    table = (tmp_path / "bpc.md").read_text()
    assert "| model | literature | dialogue |" in table
    assert f"{result['records'][0]['bits_per_char']:.3f}" in table
    assert (tmp_path / "bpc.png").stat().st_size > 5000
    assert str(tmp_path) not in (tmp_path / "bpc.json").read_text()
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    from hitoban.evaluation.bpc import shard_domain_bpc

    rows = shard_domain_bpc(model, tok, tiny_shards, max_tokens=5000)
    assert rows and rows[0]["domain"] == "literature" and np.isfinite(rows[0]["bits_per_char"])
    write_outputs({"records": [{"model": "m", **rows[0]}]}, tmp_path / "val.json")
    assert main(["eval", "bpc", str(pretrained), "--shards", str(tiny_shards), "--out",
                 str(tmp_path / "val-cli.json")]) == 0  # a model trained on these shards, with their tokenizer
    records = json.loads((tmp_path / "val-cli.json").read_text())["records"]
    assert [r["domain"] for r in records] == ["val:literature"] and np.isfinite(records[0]["bits_per_char"])


def test_bits_per_char_refuses_shards_of_another_tokenizer(tiny_model_dir, tiny_shards, pretrained, tmp_path, capsys):
    """Issue 25: shards encoded with another tokenizer gave exit 0 and a bits/char table computed on ids that mean
    other pieces. The index records its tokenizer's sha256; a model whose tokenizer differs is refused."""
    assert main(["eval", "bpc", str(tiny_model_dir), "--shards", str(tiny_shards), "--out",
                 str(tmp_path / "x.json")]) == 2
    assert "encoded with another tokenizer" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
    # control: the same tokenizer saved again (other formatting, as the Trainer re-saves it after SFT) is accepted
    resaved = tmp_path / "resaved"
    shutil.copytree(pretrained, resaved)
    data = json.loads((resaved / "tokenizer.json").read_text(encoding="utf-8"))
    (resaved / "tokenizer.json").write_text(json.dumps(data, indent=4, ensure_ascii=True), encoding="utf-8")
    assert main(["eval", "bpc", str(resaved), "--shards", str(tiny_shards), "--out", str(tmp_path / "ok.json")]) == 0


# ------------------------------------------------------------------------------------------------ generation metrics

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


# ------------------------------------------------------------------------------------------------ compare and plots

def test_compare_uses_the_same_seed_per_prompt_for_every_model(tiny_model_dir, tmp_path, capsys):
    from hitoban.evaluation.compare import compare_models

    result = compare_models([tiny_model_dir, tiny_model_dir], chat=["こんにちは"], raw=["梅雨が明けると"],
                            max_new_tokens=12)
    records = result["records"]
    assert [(r["mode"], r["prompt"]) for r in records[:2]] == [("chat", "こんにちは"), ("raw", "梅雨が明けると")]
    assert [r["reply"] for r in records[:2]] == [r["reply"] for r in records[2:]]  # same model, same seeds
    assert main(["compare", str(tiny_model_dir), "--out", str(tmp_path / "cmp"), "--max-new-tokens", "10"]) == 0
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert len(saved["records"]) == 7 and (tmp_path / "cmp" / "compare.png").stat().st_size > 5000


def test_plot_run_draws_loss_curves_and_resumes(tmp_path):
    from hitoban.evaluation.plots import plot_run

    run = tmp_path / "run"
    run.mkdir()
    records = [{"type": "train", "step": s, "loss": 9 - s / 10} for s in range(5, 55, 5)]
    records += [{"type": "resume", "step": 20, "resumes": 1},
                {"type": "eval", "step": 50, "val_loss": 4.2, "val_domains": {"web": 4.0, "aozora": 4.5}}]
    (run / "log.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    paths = plot_run(run)
    assert [p.name for p in paths] == ["loss.png"] and paths[0].stat().st_size > 10_000
    with pytest.raises(FileNotFoundError, match="no training log"):
        plot_run(tmp_path)


def test_a_missing_japanese_font_is_named_once(monkeypatch):
    from hitoban.evaluation import fonts

    monkeypatch.setattr(fonts, "CANDIDATES", ("No Such Font For hitoban",))
    monkeypatch.setattr(fonts, "_warned", False)
    with pytest.warns(UserWarning, match="fonts-ipaexfont-gothic"):
        assert fonts.use_japanese_font() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fonts.use_japanese_font() is None  # said once, not for every figure


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


# ---------------------------------------------------------------------------------------------------------------
# Issue 35.3: every held-out record is read or counted, and a corpus is cited by the bytes scanned

LEAK_TURNS = ["先週の日曜日に家族で海辺の小さな町へ出かけて、港の市場で新鮮な魚を買って帰りました。",
              "それは楽しそうですね、私も今度の休みには電車で遠くの町までのんびり旅をしてみたいと思います。"]
RECORD_FORMATS = {
    "messages": lambda u, a: {"messages": [{"role": "user", "content": u}, {"role": "assistant", "content": a}]},
    "messages with text parts": lambda u, a: {"messages": [{"role": "user", "content": [{"type": "text", "text": u}]},
                                                           {"role": "assistant", "content": a}]},
    "sharegpt": lambda u, a: {"conversations": [{"from": "human", "value": u}, {"from": "gpt", "value": a}]},
    "conversations with content": lambda u, a: {"conversations": [{"role": "user", "content": u},
                                                                  {"role": "assistant", "content": a}]},
    "user/assistant": lambda u, a: {"user": u, "assistant": a},
    "prompt/response": lambda u, a: {"prompt": u, "response": a},
    "prompt/completion": lambda u, a: {"prompt": u, "completion": a},
    "instruction/input/output": lambda u, a: {"instruction": u, "input": "", "output": a},
    "question/answer": lambda u, a: {"question": u, "answer": a},
    "text": lambda u, a: {"text": u + a},
}
UNREADABLE = [{"dialog": ["a", "b"]}, {"conversations": "not a list"}, {"messages": [{"role": "user"}]},
              {"conversations": [{"from": "human", "value": 3}]}, {"prompt": ["x"], "response": "y"}, [1, 2], "text",
              {"messages": []}, {"user": "only the question"}]


def _plant(tmp_path, records: list) -> tuple:
    """A held-out JSONL of `records` and a corpus holding every turn of LEAK_TURNS verbatim, among filler."""
    holdout = tmp_path / "holdout.jsonl"
    holdout.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(FILLER * 30 + "".join(LEAK_TURNS) + FILLER * 30, encoding="utf-8")
    return holdout, corpus


@pytest.mark.parametrize("fmt", sorted(RECORD_FORMATS))
def test_a_held_out_record_in_every_chat_format_is_probed_and_found(tmp_path, fmt):
    """Each format the rest of hitoban reads (messages, ShareGPT conversations, prompt/response, ...) is read; a
    planted verbatim leak is found and nothing is unprobed."""
    holdout, corpus = _plant(tmp_path, [RECORD_FORMATS[fmt](*LEAK_TURNS)])
    report = scan_for_leaks(holdout, [corpus])
    assert report["leaked"] and report["corpora"][0]["affected_holdout_lines"] == [1], report["coverage"]
    assert report["complete"] and report["coverage"]["unprobed_lines"] == 0


def test_the_issue_35_sharegpt_holdout_reports_every_planted_leak(tmp_path):
    """The adversary's case: 6 held-out dialogues planted verbatim, 5 of them ShareGPT records, went reported 1 of
    6 with "unprobed 0". Each record here is its own dialogue, planted whole into the corpus."""
    dialogues = [(f"{i}回目の質問です。" + LEAK_TURNS[0], f"{i}回目の答えです。" + LEAK_TURNS[1]) for i in range(6)]
    records = [RECORD_FORMATS["messages"](*dialogues[0])] + [RECORD_FORMATS["sharegpt"](*d) for d in dialogues[1:]]
    holdout, corpus = _plant(tmp_path, records)
    with open(corpus, "a", encoding="utf-8") as f:
        f.write("".join(FILLER + u + a for u, a in dialogues))
    report = scan_for_leaks(holdout, [corpus])
    assert report["corpora"][0]["affected_holdout_lines"] == [1, 2, 3, 4, 5, 6]
    assert report["coverage"]["unprobed_lines"] == 0 and report["complete"]


def test_records_no_reader_understands_are_counted_and_the_scan_is_not_clean(tmp_path, capsys):
    """Every unreadable record shape, alone beside a readable clean record: counted unprobed, named by line, the
    report is incomplete, `hitoban leaks` exits 4 (not measured) and the card does not cite it."""
    readable = RECORD_FORMATS["messages"]("全く関係のない質問文をここに長く書いておきます。" * 3, "答え" * 30)
    for bad in UNREADABLE:
        holdout, corpus = _plant(tmp_path, [readable, bad])
        report = scan_for_leaks(holdout, [corpus])
        coverage = report["coverage"]
        assert not report["complete"] and coverage["unreadable_lines"] == 1, bad
        assert coverage["unreadable_examples"] == [2] and coverage["unprobed_lines"] >= 1, bad
        assert coverage["probed_lines"] + coverage["unprobed_lines"] == coverage["lines"] == 2, bad
        assert main(["leaks", "--holdout", str(holdout), "--corpus", str(corpus)]) == 4, bad
        assert "NOT MEASURED" in capsys.readouterr().out
    holdout, corpus = _plant(tmp_path, [readable])  # the control: the readable record alone is a clean scan
    assert main(["leaks", "--holdout", str(holdout), "--corpus", str(corpus)]) == 0


def manifest_of(documents: bytes, count: int) -> str:
    """The manifest `hitoban corpus` writes for `documents` (the fields its reader checks)."""
    import hashlib

    return json.dumps({"total_chars": len(documents.decode("utf-8")), "total_documents": count, "sources": [],
                       "output": {"sha256": hashlib.sha256(documents).hexdigest(), "bytes": len(documents)}})


def test_a_corpus_folder_is_recorded_by_the_bytes_scanned_not_its_manifest(tmp_path):
    """A trimmed documents.jsonl beside its original manifest: the report records the hash of what was read and
    says it differs from the manifest, so a card matching the real corpus's hash cannot cite this scan."""
    import hashlib

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    documents = [json.dumps({"text": FILLER + str(i)}, ensure_ascii=False) + "\n" for i in range(20)]
    full = "".join(documents).encode("utf-8")
    (corpus / "manifest.json").write_text(manifest_of(full, 20))
    holdout = tmp_path / "holdout.txt"
    holdout.write_text(HOLDOUT_LINE + "\n", encoding="utf-8")
    for kept in (20, 19, 1):
        data = "".join(documents[:kept]).encode("utf-8")
        (corpus / "documents.jsonl").write_bytes(data)
        row = scan_for_leaks(holdout, [corpus])["corpora"][0]
        assert row["sha256"] == hashlib.sha256(data).hexdigest()
        assert row["matches_manifest"] is (kept == 20) and row["manifest_sha256"] == hashlib.sha256(full).hexdigest()
