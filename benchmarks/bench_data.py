"""Data pipeline throughput on real Japanese text, side by side with the raw libraries.

The corpus is the larger one (≈37 MB) where present, else the repository's tests/corpus: benchmarks/corpora.py
says which in the first line of the output.

Rows: corpus build chars/s; tokenizer training chars/s and peak RSS, hitoban (sample + SentencePiece + conversion)
vs SentencePiece alone on the same sample; encode chars/s of `hitoban shards` vs raw `Tokenizer.encode_batch` on
the same documents; chars/token on held-out literature and web text. Each training run is a fresh subprocess,
so peak RSS belongs to that run alone.

    python benchmarks/bench_data.py [--corpus DIR] [--vocab-size 32000] [--out /tmp/bench-data]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from corpora import pick_corpus


def run_measured(code: str) -> tuple[float, float]:
    """Run python code in a fresh process: (seconds, that process's own peak RSS in MiB)."""
    code = textwrap.dedent(code) + "\nimport resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return time.perf_counter() - start, int(proc.stdout.strip().splitlines()[-1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", help="corpus folder (default: the larger corpus if present, else tests/corpus)")
    parser.add_argument("--vocab-size", type=int,
                        help="default 32000; 8000 on tests/corpus, too small for 32,000 pieces")
    parser.add_argument("--out", default="/tmp/hitoban-bench-data")
    parser.add_argument("--json")
    args = parser.parse_args()
    corpus_dir, larger = pick_corpus(args.corpus)
    if args.vocab_size is None:
        args.vocab_size = 32000 if larger else 8000
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rows = []

    # 1. corpus build: literature (one work per file, no truncation) + web docs (blank-line separated pages)
    from hitoban.training.data.corpus import build_corpus, local_source
    from hitoban.training.data.filters import FilterSettings

    literature = [str(p) for p in sorted((corpus_dir / "literature").glob("0*.txt"))]
    web = [str(p) for p in sorted((corpus_dir / "web-or-wiki").glob("*.txt"))]
    raw_chars = sum(len(Path(p).read_text(encoding="utf-8")) for p in literature + web)
    start = time.perf_counter()
    manifest = build_corpus(
        [local_source(literature, name="literature", doc_per_file=True),
         local_source(web, name="web", blank_line_docs=True)],
        out / "corpus", settings=FilterSettings(max_chars=1_000_000, keep_newlines=True), progress=False)
    seconds = time.perf_counter() - start
    rows.append({"row": "corpus build (input chars/s)", "hitoban": raw_chars / seconds, "reference": None,
                 "note": f"{raw_chars:,} chars in, {manifest['total_chars']:,} out, {manifest['total_documents']:,} "
                         f"docs, rejected {manifest['filters']['rejected']}, near-dup on"})

    # 2. tokenizer training: full hitoban path vs SentencePiece alone on the very same sample file
    tok_seconds, tok_rss = run_measured(f"""
        from hitoban.training.data.tokenizer import train_tokenizer_from_corpus
        train_tokenizer_from_corpus({str(out / 'corpus')!r}, {str(out / 'tok')!r}, vocab_size={args.vocab_size})
    """)
    meta = json.loads((out / "tok" / "tokenizer_meta.json").read_text())
    sample_chars = meta["sample"]["chars"]
    run_measured(f"""
        from hitoban.training.data.corpus import iter_corpus
        from hitoban.training.data.tokenizer import write_training_sample
        write_training_sample(((r["source"], r["text"]) for r in iter_corpus({str(out / 'corpus')!r})),
                              {str(out / 'sample.txt')!r})
    """)
    spm_seconds, spm_rss = run_measured(f"""
        from hitoban.training.data.tokenizer import train_sentencepiece
        train_sentencepiece({str(out / 'sample.txt')!r}, {args.vocab_size})
    """)
    rows.append({"row": "tokenizer training (chars/s)", "hitoban": sample_chars / tok_seconds,
                 "reference": sample_chars / spm_seconds,
                 "note": f"{sample_chars:,} sample chars; hitoban {tok_seconds:.0f} s incl. imports and conversion,"
                         f" SentencePiece alone {spm_seconds:.0f} s"})
    rows.append({"row": "tokenizer training peak RSS (MiB)", "hitoban": tok_rss, "reference": spm_rss,
                 "note": "each in a fresh process"})

    # 3. encode: the shards pipeline vs raw encode_batch over the same documents
    from tokenizers import Tokenizer

    from hitoban.training.data.corpus import iter_corpus
    from hitoban.training.data.shards import build_shards

    texts = [r["text"] for r in iter_corpus(out / "corpus")]
    chars = sum(map(len, texts))
    raw = Tokenizer.from_file(str(out / "tok" / "tokenizer.json"))
    start = time.perf_counter()
    for i in range(0, len(texts), 1000):
        raw.encode_batch(texts[i : i + 1000], add_special_tokens=False)
    raw_seconds = time.perf_counter() - start
    start = time.perf_counter()
    build_shards(out / "corpus", out / "tok", out / "shards", progress=False)
    shard_seconds = time.perf_counter() - start
    rows.append({"row": "encode to shards (chars/s)", "hitoban": chars / shard_seconds,
                 "reference": chars / raw_seconds,
                 "note": "hitoban = whole `shards` build (held-out pass, encode, shuffle, hash, write); "
                         "reference = encode_batch alone"})

    # 4. chars/token on held-out text per domain
    from hitoban.training.data.tokenizer import chars_per_token, load_tokenizer

    tok = load_tokenizer(out / "tok")
    held_lit = [p.read_text(encoding="utf-8") for p in sorted((corpus_dir / "literature").glob("0*.txt"))[-40:]]
    held_web = [line for p in web for line in Path(p).read_text(encoding="utf-8").splitlines()[-2000:] if line]
    for name, texts in (("literature", held_lit), ("web", held_web)):
        rows.append({"row": f"chars/token {name}", "hitoban": chars_per_token(tok, texts), "reference": None,
                     "note": "3LM: 2.101 at 32k on web text (trained on 1.2B chars)"})

    print(f"{'row':<38}{'hitoban':>14}{'reference':>14}{'ratio':>8}")
    for row in rows:
        ref = row["reference"]
        ratio = f"{row['hitoban'] / ref:>8.2f}" if ref else ""
        ref_text = f"{ref:>14,.1f}" if ref else f"{'':>14}"
        print(f"{row['row']:<38}{row['hitoban']:>14,.1f}{ref_text}{ratio}  {row['note']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
