"""Data preparation on every core: `hitoban corpus` and `hitoban shards` with --workers 1 against N, side by side.

Each step runs as the user runs it (a fresh `hitoban` process, timed from start to exit), alternating 1 and N
workers within each round so machine drift hits both, best of `--rounds`; and paired, the median over rounds of
each round's own ratio (on a shared machine a slow spell moved one side's best by a third). The outputs of 1 and N
workers are compared byte for byte (the corpus's documents.jsonl, every shard file): a speed-up of a different
output is not one. A last row counts what the long-document rule keeps: split (the default) against truncate (3LM's).

Two speed-ups per step. End to end, on this corpus (a few seconds of work, so the start-up counts: imports, the
workers' start, torch and transformers for shards). And after start-up, the night's regime (3LM's 1.2e9
characters take most of an hour, where a start-up of seconds is nothing): each step also runs on the first fortieth
of the works (start-up and a little work), and the added characters over the added seconds (few -> all) is the rate
that a large corpus sees. The small run is subtracted, not a half: nearly all the work stays in the difference, whose
noise is then about one long run's rather than two halves'. The rates give the time for 3LM's 1.2e9 characters.
The one process that reads, de-duplicates and writes while the workers examine is timed apart (its own CPU seconds,
few -> all): its rate caps a build on any number of cores, and with 8 x one process's rate gives an 8-core estimate.
And the machine's own ceiling, each round: N one-worker runs started at once against one alone (N x alone /
together). Processes that share nothing reach it and no code passes it; on a VM whose cores share caches, memory
bandwidth or a physical core it is under N, and the speed-up is read against it.

    python benchmarks/bench_workers.py [--corpus DIR] [--workers 2] [--rounds 3] [--out /tmp/bench-workers]

The input is the corpus's literature/ (the larger corpus where present; benchmarks/corpora.py prints which).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import provenance
from corpora import pick_corpus

from hitoban.training.data.corpus import load_manifest

CLI = [sys.executable, "-m", "hitoban.cli"]
WRITER = """
import json, sys, time
from hitoban.training.data.corpus import build_corpus, local_source
from hitoban.training.data.workers import single_threaded_blas
source = local_source([sys.argv[1]], license="public domain (Aozora Bunko)", doc_per_file=True)
with single_threaded_blas():  # as the corpus verb builds
    started = time.process_time()
    build_corpus([source], sys.argv[2], workers=int(sys.argv[3]), progress=False)
print(json.dumps(time.process_time() - started))
"""


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"failed: {' '.join(command[2:5])}...\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def timed_together(commands: list[list[str]]) -> float:
    """Seconds until the last of `commands`, started at once, has finished."""
    started = time.perf_counter()
    running = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in commands]
    for command, process in zip(commands, running):
        _, err = process.communicate()
        if process.returncode:
            raise SystemExit(f"failed: {' '.join(command[2:5])}...\n{err[-3000:]}")
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


def best_of(rounds: int, workers: int, make: callable, out: Path, pattern: str,
            ceiling: bool = False) -> dict[int | str, dict]:
    """{workers: {"seconds": best, "runs": every round's seconds, "sha256": output digest}} for 1 and `workers`,
    alternating within each round; with `ceiling`, also "together": `workers` one-worker runs started at once
    (`machine_ceiling`)."""
    result = {n: {"seconds": float("inf"), "runs": [], "sha256": None} for n in (1, workers)}
    together = {"runs": []}
    for _ in range(rounds):
        for n in (1, workers):
            folder = out / f"w{n}"
            shutil.rmtree(folder, ignore_errors=True)
            result[n]["runs"].append(timed(make(folder, n)))
            result[n]["seconds"] = min(result[n]["runs"])
            result[n]["sha256"] = digest(folder, pattern)
        if ceiling:
            folders = [out / f"together{i}" for i in range(workers)]
            for folder in folders:
                shutil.rmtree(folder, ignore_errors=True)
            together["runs"].append(timed_together([make(folder, 1) for folder in folders]))
    if ceiling:
        result["together"] = together
    return result


def machine_ceiling(runs: dict, workers: int) -> float:
    """What this machine gives N processes that share nothing: N one-worker runs started at once against one
    alone, in the same round (N x alone / together, median over rounds). Code on N workers that were perfectly
    parallel would reach it; the cores' shared caches, memory and clock (or SMT siblings behind a VM's cores) keep
    it under N, and no change to hitoban moves it."""
    alone = runs[1]["runs"]
    return statistics.median(workers * one / many for one, many in zip(alone, runs["together"]["runs"]))


def paired_speedup(runs: dict[int, dict], workers: int) -> float:
    """The median over rounds of one round's 1-worker seconds over its N-worker seconds: the two ran one after the
    other, so a slow spell of the machine (another tenant) hits both sides of a ratio, not one side of the best."""
    return statistics.median(one / many for one, many in zip(runs[1]["runs"], runs[workers]["runs"]))


def writer_seconds(literature: Path, out: Path, workers: int, rounds: int) -> float:
    """CPU seconds of the one process that reads, de-duplicates and writes a corpus that `workers` processes
    examine (its workers' time not counted), least of `rounds` fresh processes: the build's serial part."""
    least = float("inf")
    for _ in range(rounds):
        shutil.rmtree(out, ignore_errors=True)
        done = subprocess.run([sys.executable, "-c", WRITER, str(literature), str(out), str(workers)],
                              capture_output=True, text=True, check=True)
        least = min(least, json.loads(done.stdout))
    return least


def first_works(literature: Path, out: Path, share: int = 40) -> Path:
    """A folder linking the first 1/`share` of the works (by name, at least 2): the smaller of the two sizes."""
    few = out / "few-literature"
    shutil.rmtree(few, ignore_errors=True)
    few.mkdir(parents=True)
    works = sorted(literature.glob("*.txt"))
    for work in works[: max(2, len(works) // share)]:
        (few / work.name).symlink_to(work.resolve())
    return few


NIGHT_CHARS = 1.2e9  # 3LM's corpus


def rates(sizes: dict[str, dict], chars: dict[str, int]) -> dict[int, float] | None:
    """Characters per second after start-up, per number of workers: the added characters over the added seconds
    from the few works to all of them (None where all took no longer than the few: noise, no rate measured)."""
    whole, few = sizes["all"], sizes["few"]
    added = {n: whole[n]["seconds"] - few[n]["seconds"] for n in few}
    if min(added.values()) <= 0:
        return None
    return {n: (chars["all"] - chars["few"]) / added[n] for n in few}


def row(name: str, sizes: dict[str, dict], chars: dict[str, int], workers: int) -> list[str]:
    """End-to-end times on all the works, and the speed-up of the rate after start-up."""
    whole, rate = sizes["all"], rates(sizes, chars)
    if rate:
        after_start = f"{rate[1] / 1e6:.2f}M / {rate[workers] / 1e6:.2f}M chars/s: {rate[workers] / rate[1]:.2f}x"
    else:
        after_start = "not measured (all the works took no longer than a few: give a larger --corpus)"
    same = all(s[1]["sha256"] == s[workers]["sha256"] for s in sizes.values())
    paired, ceiling = paired_speedup(whole, workers), machine_ceiling(whole, workers)
    return [name, f"{whole[1]['seconds']:.2f} s", f"{whole[workers]['seconds']:.2f} s",
            f"{whole[1]['seconds'] / whole[workers]['seconds']:.2f}x (paired: {paired:.2f}x)", after_start,
            f"{ceiling:.2f}x (paired speed-up {paired / ceiling:.0%} of it)", "yes" if same else "NO"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", help="corpus folder (default: the larger corpus if present, else tests/corpus)")
    parser.add_argument("--workers", type=int, default=2, help="the N set against one worker")
    parser.add_argument("--rounds", type=int, default=3, help="best of this many runs of each")
    parser.add_argument("--out", default="bench-workers")
    args = parser.parse_args()
    out, n = Path(args.out), args.workers
    literature = pick_corpus(args.corpus)[0] / "literature"
    inputs = {"few": first_works(literature, out), "all": literature}
    corpus = {size: best_of(args.rounds, n, lambda folder, w, src=src: corpus_step(src, folder, w),
                            out / "corpus" / size, "documents.jsonl", ceiling=size == "all")
              for size, src in inputs.items()}
    built = {size: out / "corpus" / size / f"w{n}" for size in inputs}
    accounts = {size: load_manifest(folder)["characters"] for size, folder in built.items()}  # where each went
    chars = {size: account["kept"] for size, account in accounts.items()}
    if not (out / "tok").exists():
        timed(CLI + ["tokenizer", "--corpus", str(built["all"]), "--out", str(out / "tok"), "--vocab-size", "8000"])
    shards = {size: best_of(args.rounds, n, lambda folder, w, c=c: shards_step(c, out / "tok", folder, w),
                            out / "shards" / size, "*.bin", ceiling=size == "all") for size, c in built.items()}
    shutil.rmtree(out / "truncated", ignore_errors=True)
    timed(corpus_step(literature, out / "truncated", n, "truncate"))
    kept = {"split": accounts["all"], "truncate": load_manifest(out / "truncated")["characters"]}
    header = ["step", "1 worker", f"{n} workers", "speed-up, end to end (best / best; paired: median of the rounds)",
              "after start-up (1 / N workers)",
              f"the machine's ceiling ({n} one-worker runs at once)", "output identical"]
    body = [row(f"corpus, {len(list(literature.glob('*.txt')))} works ({chars['all'] / 1e6:.2f}M characters kept)",
                corpus, chars, n),
            row("shards, the same corpus", shards, chars, n),
            ["long works: characters kept of those passing the filters, split (default) / truncate (3LM)",
             f"{kept['split']['kept']:,} ({kept['split']['kept_of_passing']:.1%})",
             f"{kept['truncate']['kept']:,} ({kept['truncate']['kept_of_passing']:.1%})", "", "", "", ""]]
    lines = provenance.table(header, body)
    writer = {size: writer_seconds(src, out / "writer" / size, n, args.rounds) for size, src in inputs.items()}
    cap = (chars["all"] - chars["few"]) / max(writer["all"] - writer["few"], 1e-9)
    one = rates(corpus, chars)
    lines.append(f"\nThe writing process (its own CPU, {n} workers examining): {cap / 1e6:.1f}M characters/s, the cap "
                 "on any number of cores" + (f"; 3LM's {NIGHT_CHARS:.1e} characters on 8 cores at best (8 x one "
                 f"process's rate, or that cap): {NIGHT_CHARS / min(8 * one[1], cap) / 60:.1f} min" if one else ""))
    for step, sizes in (("corpus", corpus), ("shards", shards)):
        rate = rates(sizes, chars)
        if rate:
            lines.append(f"\n3LM's {NIGHT_CHARS:.1e} characters by these rates, {step}: "
                         + ", ".join(f"{NIGHT_CHARS / rate[w] / 60:.1f} min with {w} worker{'s' * (w > 1)}"
                                     for w in rate))
    (out / "bench_workers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if any(r[-1] == "NO" for r in body):
        raise SystemExit("the output of 1 and N workers differs: the speed-up is not of the same work")


if __name__ == "__main__":
    main()
