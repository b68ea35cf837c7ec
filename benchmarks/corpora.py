"""Which corpus a benchmark reads, said in one line of its output.

Numbers are meant to be measured on a larger corpus of the layout of tests/corpus (literature/, web-or-wiki/,
dialogue/, 3lm-eval/): `--corpus DIR`, else `$HITOBAN_SHARED/corpus`, else `shared/corpus` next to the repository.
Without one, a benchmark runs on the repository's small tests/corpus (a few MB) and says so: its timings are then
not comparable with runs on the larger corpus.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REPO_CORPUS = REPO / "tests" / "corpus"


def pick_corpus(explicit: str | None = None) -> tuple[Path, bool]:
    """(corpus folder, whether it is the larger one), after printing which one this run reads."""
    if explicit:
        path = Path(explicit)
        if not (path / "literature").is_dir():
            raise SystemExit(f"--corpus {path}: no literature/ folder there (expected the layout of tests/corpus)")
        print(f"corpus: {path} (--corpus)")
        return path, path.resolve() != REPO_CORPUS.resolve()
    larger = Path(os.environ.get("HITOBAN_SHARED") or REPO.parent / "shared") / "corpus"
    if (larger / "literature").is_dir():
        print(f"corpus: {larger} (the larger corpus: HITOBAN_SHARED or shared/ next to the repository)")
        return larger, True
    print(f"corpus: {REPO_CORPUS} (the repository's small test corpus; no larger corpus at {larger}, set "
          f"HITOBAN_SHARED or --corpus): numbers are NOT comparable with runs on the larger corpus")
    return REPO_CORPUS, False
