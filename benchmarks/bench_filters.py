"""The corpus filters' own work, this checkout against an earlier commit, side by side in one process: every work of
the corpus's literature examined (`filters.examine`: cleaning, splitting, language, repetition, the duplicate keys
and MinHash signatures), then its pieces PII-masked (`filters.mask_pieces`), alternating the two versions within
each round so machine drift hits both, best of `--rounds`. The earlier version is its training/data/filters.py as
committed (`git show`), imported beside this one; both must find the same pieces, or the timing is not of the same
work.

    python benchmarks/bench_filters.py --against 3948dbf [--rounds 6]

bench_workers.py times the whole corpus verb, start-up and writing included; this times what the workers run.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import provenance
from corpora import pick_corpus

from hitoban.training.data import filters as current

REPO = Path(__file__).resolve().parent.parent


def committed_filters(revision: str):
    """training/data/filters.py as committed at `revision`, imported as a module of its own."""
    source = subprocess.run(["git", "show", f"{revision}:training/data/filters.py"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout
    with tempfile.TemporaryDirectory() as folder:  # the module's code is loaded: its file is not needed after
        path = Path(folder) / f"filters_{revision}.py"
        path.write_text(source, encoding="utf-8")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    return module


def timings(module, documents: list[str], salt: bytes) -> tuple[float, float, list]:
    """Seconds to examine every document, seconds to mask their pieces, and the pieces' texts."""
    settings = module.FilterSettings()
    started = time.perf_counter()
    found = [module.examine(raw, settings) for raw in documents]
    examined = time.perf_counter()
    for one in found:
        module.mask_pieces(one, salt)
    masked = time.perf_counter()
    return examined - started, masked - examined, [[p[0] for p in one.pieces] for one in found]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required=True, help="the earlier commit whose filters.py is timed beside")
    parser.add_argument("--rounds", type=int, default=6, help="best of this many alternating rounds")
    parser.add_argument("--corpus", help="corpus folder (default: the larger corpus if present, else tests/corpus)")
    args = parser.parse_args()
    works = sorted((pick_corpus(args.corpus)[0] / "literature").glob("*.txt"))
    documents = [work.read_text(encoding="utf-8") for work in works]
    versions = {args.against: committed_filters(args.against), "this checkout": current}
    for module in versions.values():  # what a build makes once per process (the MinHash permutations), made
        module.examine(documents[0], module.FilterSettings())
    best = {name: [float("inf"), float("inf")] for name in versions}
    pieces = {}
    for _ in range(args.rounds):
        for name, module in versions.items():
            examine_s, mask_s, pieces[name] = timings(module, documents, b"s" * 16)
            best[name] = [min(best[name][0], examine_s), min(best[name][1], mask_s)]
    if len({str(p) for p in pieces.values()}) != 1:
        raise SystemExit("the two versions found different pieces: the timing is not of the same work")
    chars = sum(map(len, documents))
    old, new = best[args.against], best["this checkout"]
    body = [[step, f"{old[i]:.2f} s", f"{new[i]:.2f} s", f"{old[i] / new[i]:.2f}x"]
            for i, step in enumerate(["examine", "mask PII"])]
    body.append(["both", f"{sum(old):.2f} s", f"{sum(new):.2f} s", f"{sum(old) / sum(new):.2f}x"])
    print(f"{len(documents)} works, {chars / 1e6:.2f}M characters, one process, best of {args.rounds}:")
    print("\n".join(provenance.table(["step", args.against, "this checkout", "speed-up"], body)))


if __name__ == "__main__":
    main()
