"""The leak scan (evaluation/leaks.py): 3LM's probes, held-out records in every chat format, corpus folders and
encodings, the CLI's exit codes, and the scan's own negative controls."""

from __future__ import annotations

import json

import pytest
from evaluation_helpers import FILLER, HOLDOUT_LINE

from hitoban.cli import main
from hitoban.errors import InputError
from hitoban.evaluation.leaks import LeakScanError, make_probes, scan_for_leaks, self_test
from hitoban.evaluation.matching import Matcher


def test_probes_follow_the_3lm_construction():
    probes = make_probes([HOLDOUT_LINE, "短い行"])
    assert len(probes) == 3 and set(probes.values()) == {1}
    unmarked = HOLDOUT_LINE.replace("<|user|>", " ").replace("<|assistant|>", " ").replace("<|end|>", " ")
    clean = " ".join(unmarked.split())
    for probe in probes:
        assert probe in clean and "<|" not in probe and len(probe.encode()) >= 96 and len(probe) >= 48
    assert clean.startswith(next(iter(probes)))


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
