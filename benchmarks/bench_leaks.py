"""Contamination-scan speed: probes from the 3LM holdout over >= 200 MB of Japanese text, one core (SPEC §7).

The corpus is the shared literature + web + dialogue text repeated until it reaches --mb megabytes (so it has
real byte statistics); the 3LM holdout gives ~600 probes. Every available engine scans the same file; the bar is
>= 200 MiB/s (3LM's NumPy Rabin-Karp: 39 MiB/s).

    python benchmarks/bench_leaks.py [--shared ../shared] [--mb 210]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", default=str(REPO.parent / "shared"))
    parser.add_argument("--mb", type=int, default=210)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from hitoban.evaluation.leaks import _Matcher, scan_for_leaks

    corpus = Path(args.shared) / "corpus"
    sources = sorted((corpus / "literature").glob("0*.txt")) + sorted((corpus / "web-or-wiki").glob("*.txt"))
    sources.append(corpus / "dialogue" / "real-persona-chat.messages.jsonl")
    text = b"".join(p.read_bytes() for p in sources)
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.txt"
        with open(big, "wb") as f:
            while f.tell() < args.mb * 1e6:
                f.write(text)
        size = big.stat().st_size
        print(f"corpus: {size / 2**20:.0f} MiB of real Japanese text; holdout: 3lm-eval/holdout_clean.txt")
        for engine in ("hyperscan", "ahocorasick-rs"):
            try:
                _Matcher([b"x" * 96], engine)
            except ImportError:
                print(f"{engine:<16} not installed")
                continue
            start = time.perf_counter()
            report = scan_for_leaks(corpus / "3lm-eval" / "holdout_clean.txt", [big], engine=engine)
            wall = time.perf_counter() - start
            row = report["corpora"][0]
            print(f"{engine:<16} {report['probes']} probes  scan {row['mib_per_s']:>7.1f} MiB/s "
                  f"(wall incl. self-test {size / 2**20 / wall:.1f} MiB/s)  hits {row['hit_probes']}  "
                  f"target >= 200 MiB/s: {'met' if row['mib_per_s'] >= 200 else 'NOT met'}")


if __name__ == "__main__":
    main()
