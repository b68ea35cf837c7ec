"""Data preparation on every core: `hitoban corpus` and `hitoban shards` with --workers 1 against N, side by side.

Each step runs as the user runs it (a fresh `hitoban` process, timed from start to exit), alternating 1 and N
workers within each round so machine drift hits both, best of `--rounds`. The outputs of 1 and N workers are
compared byte for byte (the corpus's documents.jsonl, every shard file): a speed-up of a different output is not
one. A third row counts what the long-document rule keeps: split (the default) against truncate (3LM's).

    python benchmarks/bench_workers.py [--corpus DIR] [--workers 2] [--rounds 3] [--out /tmp/bench-workers]

The input is the corpus's literature/ (the larger corpus where present; benchmarks/corpora.py prints which).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import provenance
from corpora import pick_corpus

CLI = [sys.executable, "-m", "hitoban.cli"]


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"failed: {' '.join(command[2:5])}...\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def digest(folder: Path, pattern: str) -> str:
    """One sha256 over the files of `folder` that the step promises to be the same for any number of workers."""
    sha = hashlib.sha256()
    for path in sorted(folder.glob(pattern)):
        sha.update(path.name.encode() + b"\0" + path.read_bytes())
    return sha.hexdigest()


def corpus_step(literature: Path, out: Path, workers: int, long_docs: str = "split") -> list[str]:
    return CLI + ["corpus", "--input", str(literature), "--doc-per-file", "--license", "public domain (Aozora Bunko)",
                  "--out", str(out), "--workers", str(workers), "--long-docs", long_docs]


def shards_step(corpus: Path, tokenizer: Path, out: Path, workers: int) -> list[str]:
    return CLI + ["shards", "--corpus", str(corpus), "--tokenizer", str(tokenizer), "--out", str(out), "--workers",
                  str(workers)]


def best_of(rounds: int, workers: int, make: callable, out: Path, pattern: str) -> dict[int, dict]:
    """{workers: {"seconds": best, "sha256": output digest}} for 1 and `workers`, alternating within each round."""
    result = {n: {"seconds": float("inf"), "sha256": None} for n in (1, workers)}
    for _ in range(rounds):
        for n in result:
            folder = out / f"w{n}"
            shutil.rmtree(folder, ignore_errors=True)
            result[n]["seconds"] = min(result[n]["seconds"], timed(make(folder, n)))
            result[n]["sha256"] = digest(folder, pattern)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", help="corpus folder (default: the larger corpus if present, else tests/corpus)")
    parser.add_argument("--workers", type=int, default=2, help="the N set against one worker")
    parser.add_argument("--rounds", type=int, default=3, help="best of this many runs of each")
    parser.add_argument("--out", default="bench-workers")
    args = parser.parse_args()
    out = Path(args.out)
    literature = pick_corpus(args.corpus)[0] / "literature"
    corpus = best_of(args.rounds, args.workers, lambda folder, n: corpus_step(literature, folder, n),
                     out / "corpus", "documents.jsonl")
    built = out / "corpus" / f"w{args.workers}"
    if not (out / "tok").exists():
        timed(CLI + ["tokenizer", "--corpus", str(built), "--out", str(out / "tok"), "--vocab-size", "8000"])
    shards = best_of(args.rounds, args.workers, lambda folder, n: shards_step(built, out / "tok", folder, n),
                     out / "shards", "*.bin")
    timed(corpus_step(literature, out / "truncated", args.workers, "truncate"))
    kept = {rule: json.loads((folder / "manifest.json").read_text()) for rule, folder in
            [("split", built), ("truncate", out / "truncated")]}
    chars = {rule: manifest["characters"] for rule, manifest in kept.items()}  # kept_of_passing: the manifest's
    header = ["step", "1 worker", f"{args.workers} workers", "speed-up", "output identical"]
    body = [[name, f"{r[1]['seconds']:.2f} s", f"{r[args.workers]['seconds']:.2f} s",
             f"{r[1]['seconds'] / r[args.workers]['seconds']:.2f}x",
             "yes" if r[1]["sha256"] == r[args.workers]["sha256"] else "NO"]
            for name, r in [("corpus, the literature", corpus), ("shards, the same corpus", shards)]]
    body.append(["long works: characters kept of those passing the filters, split (default) / truncate (3LM)",
                 f"{chars['split']['kept']:,} ({chars['split']['kept_of_passing']:.1%})",
                 f"{chars['truncate']['kept']:,} ({chars['truncate']['kept_of_passing']:.1%})", "", ""])
    lines = provenance.table(header, body)
    (out / "bench_workers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if any(row[4] == "NO" for row in body):
        raise SystemExit("the output of 1 and N workers differs: the speed-up is not of the same work")


if __name__ == "__main__":
    main()
