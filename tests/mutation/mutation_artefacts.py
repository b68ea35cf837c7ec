"""The README's own path, built once and small: corpus -> tokenizer -> shards -> a tiny pretraining run (both A/B
slots, final/) -> a bits/char report -> a release folder with its card. The mutation harness copies each artefact
before it damages it, so these stay pristine for the whole session."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

from hitoban.cli import main

WORKS = 6  # Aozora works from tests/corpus: enough text for a 2,500-piece tokenizer and three shard files
NIGHT = ["--preset", "tiny", "--context", "32", "--batch-size", "4", "--steps", "4", "--eval-every", "2",
         "--eval-batches", "1", "--log-every", "1", "--save-every-steps", "2", "--precision", "no", "--compile", "off",
         "--cpu", "--no-progress"]  # the tiny night; `pretrain --resume auto` on the run repeats exactly these
CONTACTS = ("お問い合わせは総務部の山田太郎までお願いします、連絡先のメールアドレスは taro.yamada@example.com です。\n"
            "予約の変更は受付の佐藤花子までお電話ください、電話番号は 03-1234-5678 です。よろしくお願いします。\n")


def quiet(argv: list[str]) -> int:
    """`hitoban ARGV` in this process with its output swallowed; a failure here is a broken fixture, not a case."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(argv)
    if code != 0:
        raise RuntimeError(f"building the artefacts: hitoban {' '.join(argv)} exited {code}:\n{out.getvalue()[-2000:]}")
    return code


def build_night(corpus_dir: Path, root: Path) -> dict[str, Path]:
    """Every artefact of the README's path, under `root`, by the verbs themselves (about 15 s on 2 cores)."""
    from hitoban.training.data.corpus import build_corpus, local_source
    from hitoban.training.data.filters import FilterSettings

    works = [str(p) for p in sorted((corpus_dir / "literature").glob("0*.txt"))[:WORKS]]
    # fake contacts at the head of one work, so the PII probe measures the corpus the model really trained on (the
    # upload gate accepts no other)
    with_contacts = root / "inputs" / "with-contacts.txt"
    with_contacts.parent.mkdir(parents=True)
    with_contacts.write_text(CONTACTS + Path(works[0]).read_text(encoding="utf-8"), encoding="utf-8")
    works[0] = str(with_contacts)
    build_corpus([local_source(works, name="literature", doc_per_file=True)], root / "corpus",
                 settings=FilterSettings(max_chars=20_000), progress=False)
    quiet(["tokenizer", "--corpus", str(root / "corpus"), "--out", str(root / "tok"), "--vocab-size", "2500",
           "--max-chars", "200000", "--context", "64"])
    quiet(["shards", "--corpus", str(root / "corpus"), "--tokenizer", str(root / "tok"), "--out",
           str(root / "shards"), "--shard-tokens", "12000", "--val-every", "4", "--context", "32"])
    quiet(["pretrain", "--data", str(root / "shards"), "--out", str(root / "run"), *NIGHT])
    text = root / "inputs" / "prose.txt"
    text.write_text(Path(works[-1]).read_text(encoding="utf-8")[:3000], encoding="utf-8")
    (root / "inputs" / "questions.jsonl").write_text(json.dumps(
        {"id": "daily_1", "category": "日常", "turns": ["雨の日は何をすればいいですか"], "keywords": ["雨"]},
        ensure_ascii=False) + "\n", encoding="utf-8")
    holdout = root / "inputs" / "holdout.jsonl"  # held-out chats the corpus never saw: leaks finds nothing
    holdout.write_text(json.dumps({"messages": [
        {"role": "user", "content": "量子計算機の誤り訂正について三行で説明してください"},
        {"role": "assistant", "content": "表面符号は隣り合う量子ビットの測定で誤りを見つけ、多数決で直します"}]},
        ensure_ascii=False) + "\n", encoding="utf-8")
    chats = root / "inputs" / "chats.jsonl"
    lines = [line.strip() for line in text.read_text(encoding="utf-8").splitlines() if len(line.strip()) >= 40]
    # the corpus's own characters (sft refuses text the tokenizer has no pieces for)
    chats.write_text("".join(json.dumps({"user": line[:20], "assistant": line[20:40]}, ensure_ascii=False) + "\n"
                             for line in lines[:8]), encoding="utf-8")
    quiet(["eval", "bpc", str(root / "run" / "final"), "--domain", f"prose={text}", "--out",
           str(root / "reports" / "bpc.json")])
    release = root / "release"
    shutil.copytree(root / "run" / "final", release)
    quiet(["card", str(release), "--repo", "me/tiny", "--from", str(root / "reports")])
    quiet(["pii", str(release), "--corpus", str(root / "corpus"), "--samples", "20", "--max-new-tokens", "8",
           "--out", str(release / "pii.json")])
    return {"corpus": root / "corpus", "tok": root / "tok", "shards": root / "shards", "run": root / "run",
            "final": root / "run" / "final", "reports": root / "reports", "release": release,
            "prose": text, "questions": root / "inputs" / "questions.jsonl", "holdout": holdout, "chats": chats}
