"""Time to the same model: `hitoban pretrain` (its defaults) against the HF Trainer on `LlamaForCausalLM`.

Same shards, same shape (`small`). The Trainer run is what a Trainer user on a CPU gets: run_clm-style contiguous
blocks, fp32, 3LM's lr 6e-4 / warmup / cosine-to-10% / clip / weight decay. Every run is timed from process start
to saved model, and every model is scored with `hitoban eval bpc`'s bits/char on held-out text never trained on
(literature and web), next to xz -9e and zstd -19 on the same text: a floor any model must beat.
The first table is time to the same model: hitoban's defaults on the Trainer's token budget, on 2/3, 1/2, 2/5 and
1/3 of it. The second gives hitoban's optimizers equal wall time (`--hours` = 2/3 of the Trainer's time): Muon +
WSD (the default) against AdamW + cosine at 3LM's lr.

    python benchmarks/bench_night.py [--tokens 983040] [--corpus DIR] [--out bench-night]

The corpus is the larger one where present, else the repository's tests/corpus (benchmarks/corpora.py; the first
line of the output says which).

Runs on CUDA and MPS unchanged (the runs pick the device; the Trainer uses it too). On a GPU machine:

    python benchmarks/bench_night.py --out /tmp/bench-night --tokens 98304000
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import provenance
from corpora import pick_corpus

from hitoban.run_folder import RunFolder, setting
from hitoban.training.data.shards import load_index

TRAINER_RUN = r'''
import json, sys, time
started = float(sys.argv[5])
import numpy as np, torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
corpus, tok_dir, out, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tok = AutoTokenizer.from_pretrained(tok_dir)
texts = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
ids = [i for enc in tok(texts, add_special_tokens=False)["input_ids"] for i in enc + [tok.eos_token_id]]
block = 256  # run_clm's group_texts: contiguous blocks, labels = inputs (the model shifts them)
blocks = np.array(ids[: len(ids) // block * block]).reshape(-1, block)
class Blocks(torch.utils.data.Dataset):  # a plain torch Dataset: `datasets` is not needed to train
    def __len__(self):
        return len(blocks)
    def __getitem__(self, i):
        row = torch.as_tensor(blocks[i], dtype=torch.long)
        return {"input_ids": row, "labels": row}
data = Blocks()
config = LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=640, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                     tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=10000.0,
                     bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
torch.manual_seed(1234)
model = LlamaForCausalLM(config)
args = TrainingArguments(output_dir=out + "/trainer", max_steps=steps, per_device_train_batch_size=16,
                         learning_rate=6e-4, warmup_steps=max(100, int(steps * 0.02)), weight_decay=0.1,
                         max_grad_norm=1.0, lr_scheduler_type="cosine_with_min_lr",
                         lr_scheduler_kwargs={"min_lr_rate": 0.1}, logging_steps=50, save_strategy="no",
                         report_to="none", seed=1234, disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=data).train()
model.save_pretrained(out)
tok.save_pretrained(out)
print(json.dumps({"seconds": time.time() - started, "params": sum(p.numel() for p in model.parameters())}))
'''


def run(command: list[str], env: dict | None = None) -> float:
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if done.returncode:
        raise SystemExit(f"failed: {' '.join(command[:6])}...\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return time.time() - started


def compressor_bpc(text: str) -> dict:
    """bits per character of the best general-purpose compressors on the held-out text alone."""
    data = text.encode("utf-8")
    rows = {"xz -9e": 8 * len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)) / len(text)}
    if shutil.which("zstd"):
        packed = subprocess.run(["zstd", "-19", "-c"], input=data, capture_output=True, check=True).stdout
        rows["zstd -19"] = 8 * len(packed) / len(text)
    return rows


HELDOUT_CHARS = 60_000  # of each held-out domain: the page's numbers


def prepare(corpus: Path, out: Path, near_dup: float = 0.85, works: int | None = None,
            heldout_chars: int = HELDOUT_CHARS) -> tuple[Path, dict[str, Path]]:
    """Corpus of the Aozora works (all but the last 3, or the first `works`; long works kept whole, in pieces),
    tokenizer (vocab 8000), shards; held-out literature (the last 3 works) and web never trained on, the first
    `heldout_chars` of each."""
    books = sorted((corpus / "literature").glob("*.txt"))
    train, held = books[:-3][:works], books[-3:]
    (out / "books").mkdir(parents=True, exist_ok=True)
    for book in train:
        shutil.copy2(book, out / "books" / book.name)
    held_dir = out / "heldout"
    held_dir.mkdir(exist_ok=True)
    (held_dir / "literature.txt").write_text("".join(b.read_text(encoding="utf-8") for b in held)[:heldout_chars],
                                             encoding="utf-8")
    web = sorted((corpus / "web-or-wiki").glob("*.txt"))
    (held_dir / "web.txt").write_text("".join(w.read_text(encoding="utf-8") for w in web)[:heldout_chars],
                                      encoding="utf-8")
    cli = [sys.executable, "-m", "hitoban.cli"]
    if not (out / "shards").exists():
        run(cli + ["corpus", "--input", str(out / "books"), "--doc-per-file", "--out", str(out / "corpus"),
                   "--license", "public domain (Aozora Bunko)", "--near-dup", str(near_dup)])
        run(cli + ["tokenizer", "--corpus", str(out / "corpus"), "--out", str(out / "tok"), "--vocab-size", "8000"])
        run(cli + ["shards", "--corpus", str(out / "corpus"), "--tokenizer", str(out / "tok"), "--out",
                   str(out / "shards"), "--context", "256"])
    return out / "shards", {"literature": held_dir / "literature.txt", "web": held_dir / "web.txt"}


def bits_per_char(model_dirs: dict[str, Path], domains: dict[str, Path], out: Path) -> dict:
    from hitoban.evaluation.bpc import cross_domain
    from hitoban.provenance import weights_sha256

    result = cross_domain(list(model_dirs.values()), domains, max_chars=None, progress=False)
    names = {weights_sha256(path): label for label, path in model_dirs.items()}  # two runs are both "final"
    return {(names[r["weights_sha256"]], r["domain"]): r["bits_per_char"] for r in result["records"]}


def table(rows: list[dict], floors: dict | None = None) -> list[str]:
    """The rows for docs/benchmarks.md, each with its machine, date and command (benchmarks/provenance.py)."""
    header = ["run", "steps", "passes over the training text", "wall s (start to saved)", "tok/s", "time vs Trainer",
              "bits/char literature", "bits/char web"]
    body = [[r["run"], r["steps"], f"{r['passes']:.2f}", r["seconds"], f"{r['tok_per_sec']:,}",
             f"{r['time_vs_trainer']:.2f}x", f"{r['bpc_literature']:.3f}", f"{r['bpc_web']:.3f}"] for r in rows]
    body += [[f"{name} (floor)", "", "", "", "", "", f"{floors['literature'][name]:.3f}", f"{floors['web'][name]:.3f}"]
             for name in (floors or {}).get("literature", {})]
    return provenance.table(header, body)


RUNS = ["same", "two-thirds", "half", "two-fifths", "third", "hours-muon", "hours-adamw"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=983_040, help="the Trainer's token budget (240 x 16 x 256)")
    parser.add_argument("--corpus", help="corpus folder (default: the larger corpus if present, else tests/corpus)")
    parser.add_argument("--out", default="bench-night")
    parser.add_argument("--works", type=int, default=None,
                        help="train on the first N works (default: all but the 3 held out; the passes are printed)")
    parser.add_argument("--near-dup", type=float, default=0.85,
                        help="the corpus's near-duplicate threshold (0: off, where mmh3 is not installed)")
    parser.add_argument("--heldout-chars", type=int, default=HELDOUT_CHARS,
                        help=f"characters of each held-out domain scored (default: {HELDOUT_CHARS:,}; the GPU "
                             "check's CPU rehearsal scores fewer)")
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=RUNS,
                        help="which hitoban runs beside the Trainer's (default: all seven)")
    args = parser.parse_args()
    out = Path(args.out)
    shards, domains = prepare(pick_corpus(args.corpus)[0], out, args.near_dup, args.works, args.heldout_chars)
    steps = args.tokens // (16 * 256)
    trainer_out = out / "runs" / "trainer-llama"
    shutil.rmtree(trainer_out, ignore_errors=True)
    seconds = {"HF Trainer + Llama (fp32)": run([sys.executable, "-c", TRAINER_RUN, str(out / "corpus" /
                                                                                        "documents.jsonl"),
                                                  str(out / "tok"), str(trainer_out), str(steps), str(time.time())])}
    runs, budgets = {"HF Trainer + Llama (fp32)": trainer_out}, {"HF Trainer + Llama (fp32)": steps}
    reference = seconds["HF Trainer + Llama (fp32)"]
    hitoban = [sys.executable, "-m", "hitoban.cli", "pretrain", "--data", str(shards), "--preset", "small",
               "--batch-size", "16", "--context", "256", "--eval-batches", "4", "--resume", "never", "--no-progress"]
    two_thirds = steps * 2 // 3
    hours = round(reference * 2 / 3 / 3600, 5)  # the second table: every run gets 2/3 of the Trainer's wall time
    plan = [("hitoban (defaults), same tokens", ["--steps", str(steps)], "same"),
            ("hitoban (defaults), 2/3 of the tokens", ["--steps", str(two_thirds)], "two-thirds"),
            ("hitoban (defaults), 1/2 of the tokens", ["--steps", str(steps // 2)], "half"),
            ("hitoban (defaults), 2/5 of the tokens", ["--steps", str(steps * 2 // 5)], "two-fifths"),
            ("hitoban (defaults), 1/3 of the tokens", ["--steps", str(steps // 3)], "third"),
            ("hitoban defaults (Muon + WSD), 2/3 of the Trainer's time", ["--hours", str(hours)], "hours-muon"),
            ("hitoban AdamW + cosine lr 6e-4 (3LM), 2/3 of the Trainer's time",
             ["--hours", str(hours), "--optimizer", "adamw", "--schedule", "cosine", "--lr", "6e-4"], "hours-adamw")]
    for label, extra, folder in [row for row in plan if row[2] in args.runs]:
        folder = out / "runs" / folder
        seconds[label] = run(hitoban + ["--out", str(folder), "--eval-every", "1000000"] + extra)
        runs[label] = folder / "final"
        budgets[label] = setting(RunFolder(folder).config(), "total_steps")
    bpc = bits_per_char(runs, domains, out)
    floors = {d: compressor_bpc(p.read_text(encoding="utf-8")) for d, p in domains.items()}
    config = RunFolder(out / "runs" / args.runs[0]).config()
    train_tokens = load_index(shards)["splits"]["train"]["tokens"]
    rows = [{"run": label, "steps": budgets[label], "seconds": round(sec, 1),
             "passes": round(budgets[label] * 16 * 256 / train_tokens, 3),  # a night reads its text about once
             "tok_per_sec": round(budgets[label] * 16 * 256 / sec), "time_vs_trainer": round(sec / reference, 3),
             **{f"bpc_{d}": round(bpc[(label, d)], 4) for d in domains}} for label, sec in seconds.items()]
    regime = ("under one pass: the night's regime" if max(r["passes"] for r in rows) < 1 else
              "MORE THAN ONE PASS over the training text: a memorising regime, not a night's; give --tokens less or a "
              "larger --corpus")
    lines = [f"Training text: {train_tokens:,} tokens; {regime}.",
             f"Trainer budget: {args.tokens:,} tokens ({steps} steps x 16 x 256). hitoban: {config['hardware']}, "
             f"torch.compile {'on' if setting(config, 'compile') is True else 'off'} (--compile auto); tok/s counts "
             "the whole process, start to saved model.", "", "Time to the same model:", ""]
    timed = [r for r in rows if r["run"].endswith("2/3 of the Trainer's time")]
    lines += table([r for r in rows if r not in timed], floors)
    if timed:  # only where the --hours runs were asked for
        lines += ["", f"Equal wall time (--hours {hours}, 2/3 of the Trainer's):", ""] + table(timed)
    report = {"tokens": args.tokens, "steps": steps, "train_tokens": train_tokens, "hardware": config["hardware"],
              "rows": rows, "floors": floors}
    (out / "bench_night.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    (out / "bench_night.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
