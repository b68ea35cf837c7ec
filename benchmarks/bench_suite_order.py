"""The full suite's wall time on N xdist workers in two file orders, simulated from one run's measured durations.

xdist's `--dist loadfile` hands a worker a whole file when fewer than three of its tests are left; the wall time is
the busiest worker's sum. Its default (`--loadscope-reorder`) re-sorts files by their number of tests; pyproject.toml
turns that off so that conftest's order holds (the longest files first, `longest_files_first`). This replays both
orders on the per-test durations of a log written with `--durations=0` (setup, call and teardown summed): a
simulation, not a second run, so both orders see the same durations (measured in whichever order that run had: a
test slowed by a heavy neighbour stays slowed in both).

    python -m pytest -p no:cacheprovider --durations=0 > full.log
    python benchmarks/bench_suite_order.py --log full.log
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import deque
from pathlib import Path, PurePosixPath

REPO = Path(__file__).resolve().parents[1]
DURATION = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S+)")


def durations(log: str) -> dict[str, float]:
    """Seconds per test id: its setup, call and teardown lines summed (a test with none listed took < 5 ms)."""
    seconds: dict[str, float] = {}
    for line in log.splitlines():
        found = DURATION.match(line)
        if found:
            seconds[found.group(3)] = seconds.get(found.group(3), 0.0) + float(found.group(1))
    return seconds


def collected(*options: str) -> list[str]:
    """The suite's test ids in conftest's order (`pytest --collect-only`, one process)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                           *options], cwd=REPO, capture_output=True, text=True)
    ids = [line.strip() for line in done.stdout.splitlines() if "::" in line]
    if done.returncode != 0 or not ids:
        sys.exit(f"pytest --collect-only {' '.join(options)} collected nothing (exit {done.returncode}): "
                 f"{(done.stderr or done.stdout)[-500:]}")
    return ids


def by_file(ids: list[str]) -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for test in ids:
        files.setdefault(test.split("::")[0], []).append(test)
    return files


def xdist_default_order(files: dict[str, list[str]], slow_files: set[str]) -> list[str]:
    """What ran before: pytest's path order, files holding a slow test first (the old conftest), then xdist's
    default re-sort by number of tests, most first (stable)."""
    natural = sorted(files, key=lambda f: PurePosixPath(f).parts)
    old = sorted(natural, key=lambda f: f not in slow_files)
    return sorted(old, key=lambda f: -len(files[f]))


def simulate(order: list[str], files: dict[str, list[str]], seconds: dict[str, float], workers: int = 2) -> list[float]:
    """Each worker's busy seconds under xdist's loadfile rule: one file each to start, another as soon as a worker
    has at most two tests left (xdist's LoadScopeScheduling._reschedule)."""
    queue = deque(order)
    clock = [0.0] * workers
    pending: list[deque] = [deque() for _ in range(workers)]
    for rounds in range(2):  # the first file each, then a second where the first is short
        for w in range(workers):
            if queue and (rounds == 0 or len(pending[w]) <= 2):
                pending[w].extend(files[queue.popleft()])
    while any(pending):
        w = min((w for w in range(workers) if pending[w]), key=lambda w: clock[w])
        clock[w] += seconds.get(pending[w].popleft(), 0.0)
        if queue and len(pending[w]) <= 2:
            pending[w].extend(files[queue.popleft()])
    return clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log", required=True, help="a full run's output with --durations=0")
    parser.add_argument("--workers", type=int, default=2, help="xdist workers (default: 2, CI's cores)")
    args = parser.parse_args()
    seconds = durations(Path(args.log).read_text(encoding="utf-8"))
    if not seconds:
        sys.exit(f"{args.log} holds no duration lines: write it with python -m pytest --durations=0")
    files = by_file(collected())
    slow_files = set(by_file(collected("-m", "slow")))
    total = sum(seconds.get(t, 0.0) for tests in files.values() for t in tests)
    print(f"{sum(map(len, files.values()))} tests in {len(files)} files, {total:,.0f} s of tests: at best "
          f"{total / args.workers:,.0f} s on {args.workers} workers")
    print("| order | each worker's seconds | wall (s) |\n|---|---|---:|")
    for name, order in (("xdist's default (by number of tests)", xdist_default_order(files, slow_files)),
                        ("conftest's (longest files first)", list(files))):
        clock = simulate(order, files, seconds, args.workers)
        print(f"| {name} | {', '.join(f'{c:,.0f}' for c in clock)} | {max(clock):,.0f} |")


if __name__ == "__main__":
    main()
