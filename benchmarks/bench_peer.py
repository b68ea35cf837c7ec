"""The strongest peer side by side: karpathy/nanochat's base recipe against hitoban's defaults (issue 37, point 4).

Both train on the same documents (hitoban's training split of the night benchmark's corpus: benchmarks/bench_night.py
`prepare`), the same tokens per step (16 x 256), and both are scored by hitoban's own bits/char windows
(training/nll.py `token_nats`: windows of 256 predicted tokens, every token once, the document separator before the
first) on the same held-out literature and web text, never trained on; each side with its own tokenizer (vocab 8000),
so bits per *character* is what compares.

nanochat runs as it ships, from a checkout of its repository (nothing of its code is in this one), in an environment
of its own that this script makes (`--env`): its own tokenizer (`scripts.tok_train`), its own model, Muon + AdamW,
warm-up/warm-down and batch-size lr scaling (`scripts.base_train`, depth 4 x aspect 64 = width 256 like `small`),
its compute dtype as it chooses it (fp32 on a CPU; `--nanochat-dtype bfloat16` opts in) and torch.compile on.
Its documents go to its parquet layout shuffled once (seed 1234), as its own data set is.

Rows: nanochat for `--tokens`; hitoban's defaults on the same tokens, given 2/3 of nanochat's wall time (`--hours`),
and on 1/3 of the tokens. The verdict is the issue's target ("nanochat's held-out bits/char in at most two thirds of
its time"), read off the fastest hitoban run at or below nanochat on both domains. Every run is timed from process
start to saved model (compilation included on both sides). Passes are counted with each side's own tokens.

    git clone https://github.com/karpathy/nanochat /tmp/nanochat   # measured at NANOCHAT_COMMIT below
    python benchmarks/bench_peer.py --nanochat /tmp/nanochat [--env /tmp/nanochat-env] [--out bench-peer]

Deviation from nanochat's pins, said in the output: its pyproject pins torch==2.9.1 from PyTorch's own index; the
package registry's Linux build of 2.9.1 is the CUDA one, so its environment here gets this project's CPU torch.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import provenance
import pyarrow as pa
import pyarrow.parquet as pq
from bench_night import bits_per_char, compressor_bpc, prepare, run
from corpora import pick_corpus

from hitoban.modeling import HitobanForCausalLM
from hitoban.run_folder import RunFolder, setting
from hitoban.training.data.corpus import iter_corpus
from hitoban.training.data.shards import choose_heldout, load_index

REPO = Path(__file__).resolve().parents[1]
NANOCHAT_COMMIT = "92d63d4e8bb4df75c3b71618f31ddde2378b2bcd"  # karpathy/nanochat, 2026-07-03: the one measured
NANOCHAT_PACKAGES = ["torch==2.13.0", "filelock", "numpy>=1.26", "psutil", "pyarrow", "rustbpe==0.1.0", "tiktoken",
                     "wandb", "kernels", "tqdm"]  # its pyproject's dependencies (tqdm: for hitoban's nll module)
BATCH, CONTEXT, VOCAB = 16, 256, 8000

# Runs in nanochat's environment, from its checkout: loads its last base checkpoint and scores it with hitoban's
# windows (training/nll.py, loaded from its file: numpy + torch + tqdm only); counts its training tokens.
SCORER = r'''
import importlib.util, json, math, sys, types
import pyarrow.parquet as pq, torch
spec = importlib.util.spec_from_file_location("hitoban_nll", sys.argv[1])
nll = importlib.util.module_from_spec(spec); spec.loader.exec_module(nll)
from nanochat.checkpoint_manager import load_model
from nanochat.common import COMPUTE_DTYPE
model, tok, meta = load_model("base", torch.device("cpu"), phase="eval", model_tag="peer")
class Logits(torch.nn.Module):  # the HF-shaped call token_nats makes: model(x, use_cache=False).logits
    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt
    def forward(self, x, use_cache=False):
        return types.SimpleNamespace(logits=self.gpt(x))
scores = {}
for name, path in json.loads(sys.argv[2]).items():
    text = open(path, encoding="utf-8").read()
    ids = tok.encode(text)
    assert tok.decode(ids) == text, f"{name}: nanochat's tokenizer does not round-trip the text"
    nats = nll.token_nats(Logits(model), ids, tok.get_bos_token_id(), 256, 16)
    scores[name] = float(nats.sum()) / math.log(2) / len(text)
train = pq.read_table(sys.argv[3]).column("text").to_pylist()
tokens = sum(len(ids) + 1 for ids in tok.encode(train))  # + its <|bos|> before every document
print(json.dumps({"bpc": scores, "params": sum(p.numel() for p in model.parameters()), "train_tokens": tokens,
                  "dtype": str(COMPUTE_DTYPE), "torch": torch.__version__}))
'''


def call(command: list[str], env: dict, cwd: Path) -> str:
    """Run one of nanochat's commands in its checkout; its standard output, or exit with the tail of both."""
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env={**os.environ, **env})
    if done.returncode:
        raise SystemExit(f"failed: {' '.join(command[:4])}...\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def ensure_env(env: Path) -> Path:
    """nanochat's own environment (made once, reused): its dependencies, none of hitoban's."""
    python = env / "bin" / "python"
    if not python.exists():
        print(f"making nanochat's environment in {env} (a few minutes, once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *NANOCHAT_PACKAGES], check=True)
    return python


def checkout_commit(nanochat: Path) -> str:
    if not (nanochat / "scripts" / "base_train.py").is_file():
        raise SystemExit(f"--nanochat {nanochat}: not a checkout of karpathy/nanochat (no scripts/base_train.py)")
    done = subprocess.run(["git", "-C", str(nanochat), "rev-parse", "HEAD"], capture_output=True, text=True)
    commit = done.stdout.strip() if done.returncode == 0 else "unknown (not a git checkout)"
    if commit != NANOCHAT_COMMIT:
        print(f"note: nanochat at {commit}, not the commit measured for the results page ({NANOCHAT_COMMIT})")
    return commit


def write_parquet(corpus: Path, shards: Path, base: Path) -> Path:
    """hitoban's training documents (its own split rule, read from the shards' index) as nanochat's data set: the
    training shard, then hitoban's validation documents as the last shard (nanochat's val split)."""
    rule = load_index(shards)["split_rule"]
    heldout = choose_heldout(corpus, rule["val_every"], rule["max_docs_per_heldout_split"])
    train, val = [], []
    for index, record in enumerate(iter_corpus(corpus)):
        {None: train, "val": val}.get(heldout.get(index), []).append(record["text"])
    random.Random(1234).shuffle(train)
    data = base / "base_data_climbmix"
    data.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": train}), data / "shard_00000.parquet", row_group_size=64)
    pq.write_table(pa.table({"text": val}), data / "shard_00001.parquet", row_group_size=64)
    return data / "shard_00000.parquet"


def train_nanochat(python: Path, nanochat: Path, base: Path, steps: int, dtype: str | None,
                   extra: list[str]) -> tuple[float, str]:
    """Its tokenizer (once), then its base_train at this benchmark's shape and batch; (seconds, its output)."""
    env = {"NANOCHAT_BASE_DIR": str(base), "WANDB_MODE": "disabled", "PYTHONPATH": str(nanochat),
           **({"NANOCHAT_DTYPE": dtype} if dtype else {})}
    if not (base / "tokenizer" / "tokenizer.pkl").exists():
        call([str(python), "-m", "scripts.tok_train", f"--vocab-size={VOCAB}"], env, nanochat)
    started = time.time()
    log = call([str(python), "-m", "scripts.base_train", "--device-type=cpu", "--depth=4", "--aspect-ratio=64",
               "--head-dim=64", "--window-pattern=L", f"--max-seq-len={CONTEXT}", f"--device-batch-size={BATCH}",
               f"--total-batch-size={BATCH * CONTEXT}", f"--num-iterations={steps}", "--eval-every=-1",
               "--core-metric-every=-1", "--sample-every=-1", "--model-tag=peer", "--run=dummy", *extra],
               env, nanochat)
    seconds = time.time() - started
    (base / "base_train.log").write_text(log)
    return seconds, log


def score_nanochat(python: Path, nanochat: Path, base: Path, domains: dict[str, Path], train: Path) -> dict:
    env = {"NANOCHAT_BASE_DIR": str(base), "PYTHONPATH": str(nanochat)}
    out = call([str(python), "-c", SCORER, str(REPO / "training" / "nll.py"),
                json.dumps({d: str(p) for d, p in domains.items()}), str(train)], env, nanochat)
    return json.loads(out.strip().splitlines()[-1])


def train_hitoban(shards: Path, out: Path, steps: int, peer_seconds: float) -> tuple[dict, dict]:
    """hitoban's defaults on nanochat's tokens, on 2/3 of nanochat's wall time and on 1/3 of its tokens: (folder,
    seconds) by label, same tokens first."""
    hitoban = [sys.executable, "-m", "hitoban.cli", "pretrain", "--data", str(shards), "--preset", "small",
               "--batch-size", str(BATCH), "--context", str(CONTEXT), "--eval-batches", "4", "--resume", "never",
               "--no-progress", "--eval-every", "1000000"]
    same = "hitoban (defaults), same tokens"
    folders, seconds = {same: out / "runs" / "same-tokens"}, {}
    seconds[same] = run(hitoban + ["--out", str(folders[same]), "--steps", str(steps)])
    # --hours budgets the training session; start-up and saving (measured on the first run) come off the 2/3
    overhead = seconds[same] - json.loads((folders[same] / "summary.json").read_text())["session_seconds"]
    hours = round(max(peer_seconds * 2 / 3 - overhead, 1.0) / 3600, 5)
    for label, folder, budget in [
            (f"hitoban (defaults), --hours {hours} (2/3 of nanochat's time less start-up)", "two-thirds-time",
             ["--hours", str(hours)]),
            ("hitoban (defaults), 1/3 of the tokens", "third-tokens", ["--steps", str(steps // 3)])]:
        folders[label] = out / "runs" / folder
        seconds[label] = run(hitoban + ["--out", str(folders[label])] + budget)
    return folders, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nanochat", required=True, help="a checkout of karpathy/nanochat (see NANOCHAT_COMMIT)")
    parser.add_argument("--env", default=None,
                        help="nanochat's environment (default: OUT/nanochat-env; made if absent)")
    parser.add_argument("--tokens", type=int, default=983_040, help="nanochat's token budget (240 x 16 x 256)")
    parser.add_argument("--corpus", help="corpus folder (default: the larger corpus if present, else tests/corpus)")
    parser.add_argument("--out", default="bench-peer")
    parser.add_argument("--nanochat-dtype", choices=["bfloat16", "float32"], default=None,
                        help="nanochat's NANOCHAT_DTYPE (default: unset, its own choice: fp32 on a CPU)")
    parser.add_argument("--nanochat-args", nargs=argparse.REMAINDER, default=[],
                        help="the rest of the line goes to nanochat's base_train (e.g. --matrix-lr=0.02); last")
    args = parser.parse_args()
    out, nanochat = Path(args.out).resolve(), Path(args.nanochat).resolve()
    commit = checkout_commit(nanochat)
    python = ensure_env(Path(args.env).resolve() if args.env else out / "nanochat-env")
    shards, domains = prepare(pick_corpus(args.corpus)[0], out)
    steps = args.tokens // (BATCH * CONTEXT)
    base = out / "nanochat-base"
    train_parquet = write_parquet(out / "corpus", shards, base)
    peer_seconds, peer_log = train_nanochat(python, nanochat, base, steps, args.nanochat_dtype,
                                             args.nanochat_args)
    peer = score_nanochat(python, nanochat, base, domains, train_parquet)

    folders, seconds = train_hitoban(shards, out, steps, peer_seconds)
    bpc = bits_per_char({label: folder / "final" for label, folder in folders.items()}, domains, out)
    train_tokens = load_index(shards)["splits"]["train"]["tokens"]
    config = RunFolder(next(iter(folders.values()))).config()
    compiled = "on" if setting(config, "compile") is True else "off"
    rows = [{"run": f"nanochat base_train ({commit[:7]})", "params": peer["params"],
             "precision": peer["dtype"].replace("torch.", ""), "compile": "on", "steps": steps,
             "passes": steps * BATCH * CONTEXT / peer["train_tokens"], "seconds": peer_seconds,
             **{f"bpc_{d}": peer["bpc"][d] for d in domains}}]
    for label, folder in folders.items():
        done = setting(RunFolder(folder).config(), "total_steps")
        rows.append({"run": label, "params": HitobanForCausalLM.from_pretrained(folder / "final").num_parameters(),
                     "precision": setting(config, "precision"), "compile": compiled, "steps": done,
                     "passes": done * BATCH * CONTEXT / train_tokens, "seconds": seconds[label],
                     **{f"bpc_{d}": bpc[(label, d)] for d in domains}})
    floors = {d: compressor_bpc(p.read_text(encoding="utf-8")) for d, p in domains.items()}
    lines = report(rows, peer_seconds, floors, peer_log)
    (out / "bench_peer.json").write_text(json.dumps({"nanochat_commit": commit, "nanochat_torch": peer["torch"],
                                                     "rows": rows, "floors": floors}, indent=2, ensure_ascii=False))
    (out / "bench_peer.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def report(rows: list[dict], peer_seconds: float, floors: dict, peer_log: str) -> list[str]:
    """The results page's table (nanochat first) and the verdict on issue 37's target."""
    header = ["run", "parameters", "precision", "compile", "steps", "passes", "wall s (start to saved)",
              "time vs nanochat", "bits/char literature", "bits/char web"]
    body = [[r["run"], f"{r['params'] / 1e6:.1f}M", r["precision"], r["compile"], r["steps"], f"{r['passes']:.2f}",
             f"{r['seconds']:.1f}", f"{r['seconds'] / peer_seconds:.2f}x", f"{r['bpc_literature']:.3f}",
             f"{r['bpc_web']:.3f}"] for r in rows]
    body += [[f"{name} (floor)", "", "", "", "", "", "", "", f"{floors['literature'][name]:.3f}",
              f"{floors['web'][name]:.3f}"] for name in floors["literature"]]
    peer = rows[0]
    beats = [r for r in rows[1:] if all(r[f"bpc_{d}"] <= peer[f"bpc_{d}"] for d in ("literature", "web"))]
    fastest = min(beats, key=lambda r: r["seconds"], default=None)  # measured start to saved, not a budget
    ratio = fastest["seconds"] / peer_seconds if fastest else None
    dtype_line = next((line for line in peer_log.splitlines() if re.search(r"COMPUTE_DTYPE", line)), "")
    lr_line = next((line for line in peer_log.splitlines() if line.startswith("Scaling LRs")), "its lrs unscaled")
    verdict = (f"{'MET' if ratio <= 2 / 3 else 'NOT MET'}: the fastest hitoban run at or below nanochat's held-out "
               f"bits/char on both domains ({fastest['run']}) took {ratio:.2f}x of nanochat's time" if fastest else
               "NOT MET: no hitoban run reached nanochat's held-out bits/char on both domains")
    return [f"nanochat: {dtype_line.strip()}; {lr_line.strip()}. hitoban: its run folders' config.json.", "",
            *provenance.table(header, body), "",
            f"Target (issue 37: nanochat's held-out bits/char in at most 2/3 of its time): {verdict}."]


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
