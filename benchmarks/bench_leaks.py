"""Contamination-scan speed: probes from the 3LM holdout over >= 200 MB of Japanese text, one core
(docs/design.md §13, §17).

The corpus (benchmarks/corpora.py says which) is its literature + web + dialogue text repeated until it reaches
--mb megabytes (so it has real byte statistics), with one holdout probe planted after each copy, so every engine
must report exactly those hits. 3lm-eval/holdout.txt gives 658 probes. Every available engine scans the same file;
the bar is >= 200 MiB/s (3LM's NumPy Rabin-Karp: 39 MiB/s).

    python benchmarks/bench_leaks.py [--corpus DIR] [--mb 210]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from corpora import pick_corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", help="corpus folder (default: the larger corpus if present, else tests/corpus)")
    parser.add_argument("--mb", type=int, default=210)
    parser.add_argument("--holdout", default="holdout.txt", help="file in 3lm-eval/ (holdout.txt: 658 probes)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from hitoban.evaluation.leaks import make_probes, scan_for_leaks
    from hitoban.evaluation.matching import Matcher

    corpus, _ = pick_corpus(args.corpus)
    sources = sorted((corpus / "literature").glob("0*.txt")) + sorted((corpus / "web-or-wiki").glob("*.txt"))
    sources.append(corpus / "dialogue" / "real-persona-chat.messages.jsonl")
    text = b"".join(p.read_bytes() for p in sources)
    holdout = corpus / "3lm-eval" / args.holdout
    probes = [p.encode() for p in make_probes(holdout.read_text(encoding="utf-8").splitlines())]
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.txt"
        planted = 0
        with open(big, "wb") as f:
            while f.tell() < args.mb * 1e6:
                f.write(text)
                f.write(b"\n" + probes[planted * 7 % len(probes)] + b"\n")  # a known leak per copy: hits must match
                planted += 1
        size = big.stat().st_size
        print(f"corpus: {size / 2**20:.0f} MiB of real Japanese text with {planted} planted probes; holdout: "
              f"3lm-eval/{args.holdout}")
        for engine in ("sampled-grams", "hyperscan", "ahocorasick-rs"):
            try:
                Matcher([b"x" * 96], engine)  # raises ImportError when the library is missing
            except ImportError:
                print(f"{engine:<16} not installed")
                continue
            start = time.perf_counter()
            report = scan_for_leaks(holdout, [big], engine=engine)
            wall = time.perf_counter() - start
            row = report["corpora"][0]
            print(f"{engine:<16} {report['probes']} probes  scan {row['mib_per_s']:>7.1f} MiB/s "
                  f"(wall incl. self-test {size / 2**20 / wall:.1f} MiB/s)  probes hit {row['hit_probes']} "
                  f"(planted {planted})  target >= 200 MiB/s: "
                  f"{'met' if row['mib_per_s'] >= 200 else 'NOT met'}")


if __name__ == "__main__":
    main()
