"""Regenerate the figures the README and the guides show, with hitoban itself: `hitoban demo --quick` up to the
pretraining stage (corpus, tokenizer, shards, calibration, a night killed twice and resumed), then its loss curve and
kill-test figure copied into docs/images/.

    python docs/figures.py [--work /tmp/hitoban-figures]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from hitoban.cli import main as hitoban

IMAGES = Path(__file__).resolve().parent / "images"
FIGURES = {"plots/loss.png": "demo-loss.png", "killtest.png": "demo-killtest.png"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/hitoban-figures", help="the demo's folder (replaced)")
    work = Path(parser.parse_args().work)
    if hitoban(["demo", "--quick", "--until", "pretrain", "--out", str(work), "--force"]) != 0:
        raise SystemExit("the demo failed: no figure was replaced")
    IMAGES.mkdir(exist_ok=True)
    for made, shown in FIGURES.items():
        shutil.copyfile(work / made, IMAGES / shown)
        print(f"{work / made} -> {IMAGES / shown}")


if __name__ == "__main__":
    main()
