"""Start-up of the verbs that need no model, and `hitoban leaks` end to end over >= 200 MB of Japanese text.

Each verb runs as the installed `hitoban` console script in a fresh process, on small real inputs made here (a tiny
model folder, shards of 30 Aozora works, a heartbeat, this repository's release/ folder, 5 works to scan),
--repeats times; the table shows the median wall seconds and the heavy libraries the process imported (read from
`python -X importtime`). The bar is <= 1 s each, without torch or transformers. Then `hitoban leaks` scans the
corpus text (benchmarks/corpora.py says which) repeated to --mb megabytes with one holdout probe planted per copy
(bench_leaks.py's file), end to end: start-up, reading, probe building, the engine's self-test and the scan. The
bar is >= 150 MiB/s on 2 cores; the engine's own figure (the report's mib_per_s) is printed beside it.

    python benchmarks/bench_startup.py [--corpus DIR] [--mb 210] [--repeats 3] [--skip-leaks]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from corpora import pick_corpus

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "accelerate", "datasets", "gradio", "matplotlib", "pandas", "pyarrow", "scipy",
         "sentencepiece", "tokenizers", "safetensors", "huggingface_hub", "numpy")


def console_script() -> str:
    """The `hitoban` entry point of this interpreter's environment (what a user runs)."""
    path = Path(sys.executable).parent / "hitoban"
    if not path.exists():
        raise SystemExit(f"{path} is missing: install hitoban (pip install -e .) into this environment first")
    return str(path)


def imported_heavy(stderr: str) -> list[str]:
    """The HEAVY libraries named in a `-X importtime` log."""
    names = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in stderr.splitlines()
             if line.startswith("import time:")}
    return [name for name in HEAVY if name in names]


def run_verb(argv: list[str], cwd: Path, importtime: bool = False) -> tuple[float, subprocess.CompletedProcess]:
    command = [sys.executable, *(["-X", "importtime"] if importtime else []), console_script(), *argv]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 1):  # leaks and secrets exit 1 on findings
        raise RuntimeError(f"hitoban {' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return seconds, proc


def make_inputs(corpus: Path, root: Path) -> dict[str, Path]:
    """Small real inputs for every verb (the setup imports torch here, in this process only)."""
    import shutil

    import torch
    from transformers import AutoTokenizer

    from hitoban import HitobanConfig, HitobanForCausalLM
    from hitoban.provenance import weights_sha256
    from hitoban.training.data.corpus import build_corpus, local_source
    from hitoban.training.data.filters import FilterSettings
    from hitoban.training.data.shards import build_shards
    from hitoban.training.data.tokenizer import train_tokenizer_from_corpus

    literature = sorted((corpus / "literature").glob("0*.txt"))
    build_corpus([local_source([str(p) for p in literature[:30]], name="literature", doc_per_file=True)],
                 root / "corpus", settings=FilterSettings(max_chars=60_000), progress=False)
    train_tokenizer_from_corpus(root / "corpus", root / "tokenizer", vocab_size=4000)
    build_shards(root / "corpus", root / "tokenizer", root / "shards", shard_tokens=80_000, val_every=8, context=64,
                 progress=False)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(root / "tokenizer")
    HitobanForCausalLM(HitobanConfig.from_preset("tiny", vocab_size=len(tok))).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    (root / "model" / "pii.json").write_text(json.dumps(
        {"kind": "pii-probe", "tried": 60, "exact": 0, "partial": 0, "weights_sha256": weights_sha256(root / "model")}))
    (root / "run").mkdir()
    (root / "run" / "heartbeat.json").write_text(json.dumps(
        {"step": 50, "total_steps": 100, "tokens_seen": 51200, "token_budget": 102400, "train_loss": 3.2,
         "best_val": 3.4, "lr": 1e-3, "tok_per_sec": 12000, "elapsed_hours": 0.1, "resumes": 0, "eta_hours": 0.1,
         "updated_at": time.time(), "finished": False}))
    (root / "small.txt").write_bytes(b"".join(p.read_bytes() for p in literature[:5]))
    shutil.copytree(REPO / "release", root / "release", ignore=shutil.ignore_patterns("__pycache__"))
    return {"holdout": corpus / "3lm-eval" / "holdout.txt", **{name: root / name for name in (
        "model", "shards", "run", "small.txt", "release")}}


def verbs(inputs: dict[str, Path]) -> list[tuple[str, list[str]]]:
    model = str(inputs["model"])
    return [
        ("--help", ["--help"]),
        ("leaks (5 works)", ["leaks", "--holdout", str(inputs["holdout"]), "--corpus", str(inputs["small.txt"])]),
        ("secrets", ["secrets", str(inputs["release"])]),
        ("watch --once", ["watch", str(inputs["run"]), "--once"]),
        ("shards --verify", ["shards", "--verify", str(inputs["shards"])]),
        ("card", ["card", model, "--repo", "someone/hitoban-tiny"]),  # before upload: it writes the README
        ("upload --dry-run", ["upload", model, "--repo", "someone/hitoban-tiny", "--dry-run"]),
    ]


def write_big(corpus: Path, mb: int, holdout: Path, path: Path) -> int:
    """The corpus text repeated to `mb` megabytes, one holdout probe planted per copy (bench_leaks.py's file)."""
    from hitoban.evaluation.leaks import make_probes

    sources = sorted((corpus / "literature").glob("0*.txt")) + sorted((corpus / "web-or-wiki").glob("*.txt"))
    sources.append(corpus / "dialogue" / "real-persona-chat.messages.jsonl")
    text = b"".join(p.read_bytes() for p in sources)
    probes = [p.encode() for p in make_probes(holdout.read_text(encoding="utf-8").splitlines())]
    planted = 0
    with open(path, "wb") as f:
        while f.tell() < mb * 1e6:
            f.write(text)
            f.write(b"\n" + probes[planted * 7 % len(probes)] + b"\n")
            planted += 1
    return planted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", help="corpus folder (default: the larger corpus if present, else tests/corpus)")
    parser.add_argument("--mb", type=int, default=210, help="size of the end-to-end leak scan")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-leaks", action="store_true", help="only the start-up table")
    args = parser.parse_args()
    corpus, _ = pick_corpus(args.corpus)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        inputs = make_inputs(corpus, root)
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (timings scale with it)")
        print(f"start-up, `hitoban VERB` in a fresh process, median of {args.repeats} (bar <= 1 s):")
        for name, argv in verbs(inputs):
            _, proc = run_verb(argv, root, importtime=True)
            heavy = imported_heavy(proc.stderr)
            times = [run_verb(argv, root)[0] for _ in range(args.repeats)]
            print(f"  {name:<18} {statistics.median(times):6.2f} s  (min {min(times):.2f})  imports: "
                  f"{', '.join(heavy) or 'none of the heavy libraries'}")
        if args.skip_leaks:
            return
        big, report = root / "big.txt", root / "leaks.json"
        planted = write_big(corpus, args.mb, inputs["holdout"], big)
        size = big.stat().st_size / 2**20
        walls, engine = [], []
        for _ in range(args.repeats):
            wall, _ = run_verb(["leaks", "--holdout", str(inputs["holdout"]), "--corpus", str(big), "--out",
                                str(report)], root)
            walls.append(wall)
            row = json.loads(report.read_text())["corpora"][0]
            engine.append(row["mib_per_s"])
            assert row["hit_probes"] >= 1, row
        wall = statistics.median(walls)
        print(f"`hitoban leaks` end to end on {size:.0f} MiB ({planted} planted probes, {row['engine']}): "
              f"{wall:.2f} s = {size / wall:.0f} MiB/s (median of {args.repeats}; bar >= 150), "
              f"engine alone {statistics.median(engine):.0f} MiB/s")


if __name__ == "__main__":
    main()
