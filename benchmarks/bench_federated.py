"""The yardstick for `hitoban federate`: one machine's `hitoban pretrain` against DiLoCo runs of 1, 2 and 4 machines.

Same shards (benchmarks/bench_night.py's), same shape, same total tokens. The federated runs are the README's
commands on loopback: `hitoban federate serve --insecure` and N `hitoban federate join` processes, Flower's real
SuperLink and SuperNodes (every message pays Flower's polling, ~3 s each way, and a fresh ClientApp process). The
machines share this computer's cores (each gets cores / N threads), so wall time says what the protocol costs here,
not what N computers would take. Every model is scored with `hitoban eval bpc`'s bits/char on held-out literature and
web never trained on. Bytes: what each machine sent (fp16 deltas) and received (fp32 weights the first time, then the
fp16 outer update), the ArrayRecords' sizes, against what DDP would move at the same tokens and global batch: a ring
all-reduce of fp32 gradients sends 2 (n - 1) / n x 4 bytes per parameter per step from each machine and receives as
many. Both ratios are printed: bytes sent, and bytes sent + received.

`--machine-batch` is each machine's batch (default: the single run's 16 divided among the machines, so every machine
takes the single run's sequential steps and the global batch is the same); `--outer-lr 1 --outer-momentum 0` is plain
token-weighted averaging instead of DiLoCo's Nesterov step. `--in-process` runs the same server and machine code
through the tests' in-process grid (tests/training/federated/test_server.py's LocalGrid: no Flower processes, no
polling, the machines one after another), about half the time: for sweeps; the README's target rows are Flower's.
`--seed` is every run's (the single run's too): a run per seed says how far one comparison moves by chance alone.

    python benchmarks/bench_federated.py [--tokens 2457600] [--inner-steps 75] [--machines 1 2 4] [--out DIR]
                                         [--machine-batch B] [--outer-lr 0.7] [--outer-momentum 0.9] [--seed 1234]
                                         [--in-process]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import provenance
from bench_night import bits_per_char, prepare, run
from corpora import pick_corpus

CLI = [sys.executable, "-m", "hitoban.cli"]
SHAPE = ["--preset", "tiny", "--context", "256", "--cpu"]
BATCH = 16  # the single run's batch


def federated(shards: Path, out: Path, machines: int, tokens: int, inner_steps: int, batch: int,
              shape: list[str], outer: list[str]) -> dict:
    """serve + `machines` joins on loopback; returns the summary and the wall time from the first process start."""
    from hitoban.training.federated.launch import free_port

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    port = free_port()
    started = time.time()
    threads = str(max(1, (os.cpu_count() or 2) // machines))
    server = subprocess.Popen(CLI + ["federate", "serve", "--data", str(shards), "--out", str(out / "run"),
                                     *[a for a in shape if a != "--cpu"],  # each machine's own: join takes it
                                     "--batch-size", str(batch), *outer, "--tokens", str(tokens), "--inner-steps",
                                     str(inner_steps), "--probe-steps", str(inner_steps), "--min-machines",
                                     str(machines), "--port", str(port), "--insecure", "--eval-every", "1000"],
                              stdout=open(out / "serve.log", "wb"), stderr=subprocess.STDOUT)
    joins = [subprocess.Popen(CLI + ["federate", "join", f"127.0.0.1:{port}", "--data", str(shards), "--state",
                                     str(out / f"machine-{i}"), "--name", f"machine-{i}", "--insecure", "--cpu"],
                              stdout=open(out / f"machine-{i}.log", "wb"), stderr=subprocess.STDOUT,
                              env={**os.environ, "OMP_NUM_THREADS": threads})
             for i in range(machines)]
    code = server.wait()
    for join in joins:
        try:
            join.wait(60)
        except subprocess.TimeoutExpired:
            join.kill()
    if code:
        raise SystemExit(f"federate serve failed:\n{(out / 'serve.log').read_text()[-3000:]}")
    return {"seconds": time.time() - started, **json.loads((out / "run" / "summary.json").read_text())}


def in_process(shards: Path, out: Path, machines: int, batch: int, args: argparse.Namespace) -> dict:
    """The same rounds through the tests' in-process grid: the server's and the machines' code, Flower's records,
    no processes."""
    import dataclasses

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "training" / "federated"))
    from test_server import LocalGrid

    from hitoban.training.federated.inner import Machine
    from hitoban.training.federated.options import ServeOptions
    from hitoban.training.federated.server import OPTIONS_FILE, Server

    shutil.rmtree(out, ignore_errors=True)
    (out / "run").mkdir(parents=True)
    options = ServeOptions(data=str(shards), out=str(out / "run"), preset="tiny", context=256, cpu=True,
                           seed=args.seed, batch_size=batch, tokens=args.tokens, inner_steps=args.inner_steps,
                           probe_steps=args.inner_steps, min_machines=machines, eval_every=1000,
                           outer_lr=args.outer_lr, outer_momentum=args.outer_momentum, insecure=True)
    (out / "run" / OPTIONS_FILE).write_text(json.dumps(dataclasses.asdict(options)))
    started = time.time()
    grid = LocalGrid({10 + i: Machine(shards, out / f"machine-{i}", f"machine-{i}", cpu=True) for i in range(machines)})
    summary = Server(out / "run", log=lambda *a: None).serve(grid)
    return {"seconds": time.time() - started, **summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=2_457_600, help="every run's token budget (600 x 16 x 256)")
    parser.add_argument("--inner-steps", type=int, default=75, help="DiLoCo's H for the federated runs")
    parser.add_argument("--machines", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--machine-batch", type=int, help="each machine's batch (default: 16 / machines)")
    parser.add_argument("--outer-lr", type=float, default=0.7, help="the server's outer lr (DiLoCo: 0.7)")
    parser.add_argument("--outer-momentum", type=float, default=0.9, help="its Nesterov momentum (0: plain averaging)")
    parser.add_argument("--seed", type=int, default=1234, help="every run's seed (the night's default: 1234)")
    parser.add_argument("--in-process", action="store_true", help="the tests' in-process grid instead of Flower's "
                        "processes (for sweeps)")
    parser.add_argument("--corpus", help="corpus folder (default: the larger corpus if present, else tests/corpus)")
    parser.add_argument("--out", default="bench-federated")
    args = parser.parse_args()
    shape = SHAPE + ["--seed", str(args.seed)]
    out = Path(args.out)
    shards, domains = prepare(pick_corpus(args.corpus)[0], out)
    from hitoban.modeling import HitobanForCausalLM

    single = out / "runs" / "single"
    shutil.rmtree(single, ignore_errors=True)
    seconds = {"one machine (hitoban pretrain)": run(CLI + ["pretrain", "--data", str(shards), *shape, "--batch-size",
                                                            str(BATCH), "--tokens",
                                                            str(args.tokens), "--out", str(single), "--no-progress"])}
    models = {"one machine (hitoban pretrain)": single / "final"}
    summaries = {}
    outer = ["--outer-lr", str(args.outer_lr), "--outer-momentum", str(args.outer_momentum)]
    batches = {}  # label -> (machines, each machine's batch)
    for n in args.machines:
        batch = args.machine_batch or max(1, BATCH // n)
        label = (f"federated, {n} machine{'s' if n > 1 else ''} x batch {batch} (H={args.inner_steps}, outer lr "
                 f"{args.outer_lr:g}, momentum {args.outer_momentum:g}{', in-process' if args.in_process else ''})")
        batches[label] = (n, batch)
        summaries[label] = (in_process(shards, out / "runs" / f"fed-{n}", n, batch, args) if args.in_process else
                            federated(shards, out / "runs" / f"fed-{n}", n, args.tokens, args.inner_steps, batch,
                                      shape, outer))
        seconds[label] = summaries[label]["seconds"]
        models[label] = out / "runs" / f"fed-{n}" / "run" / "final"
    bpc = bits_per_char(models, domains, out)
    params = HitobanForCausalLM.from_pretrained(single / "final").num_parameters()  # tied: counted once
    base = {d: bpc[("one machine (hitoban pretrain)", d)] for d in ("literature", "web")}
    header = ["run", "rounds", "wall s", "bits/char literature", "bits/char web", "vs one machine (lit / web)",
              "MB sent / received per machine", "DDP MB sent / received", "DDP / federated, sent",
              "DDP / federated, sent + received"]
    body = []
    for label in models:
        lit, web = bpc[(label, "literature")], bpc[(label, "web")]
        scores = [f"{lit:.3f}", f"{web:.3f}", f"{lit - base['literature']:+.3f} / {web - base['web']:+.3f}"]
        if label not in summaries:
            body.append([label, "-", f"{seconds[label]:.0f}", *scores, "-", "-", "-", "-"])
            continue
        s = summaries[label]
        n = len([m for m in s["per_machine"].values() if m["windows"]])
        sent = max(m["bytes_up"] for m in s["per_machine"].values()) / 1e6
        received = max(m["bytes_down"] for m in s["per_machine"].values()) / 1e6
        steps = args.tokens // (batches[label][0] * batches[label][1] * 256)  # DDP's steps at this global batch
        ddp = steps * 2 * (n - 1) / n * 4 * params / 1e6 if n > 1 else 0.0  # sent, and as much received
        ratios = [f"{ddp / sent:,.0f}x", f"{2 * ddp / (sent + received):,.0f}x"] if ddp else ["(no all-reduce)"] * 2
        body.append([label, s["rounds"], f"{seconds[label]:.0f}", *scores, f"{sent:,.1f} / {received:,.1f}",
                     f"{ddp:,.1f} / {ddp:,.1f}", *ratios])
    lines = [f"same shards, `tiny` shape ({params / 1e6:.2f}M parameters), {args.tokens:,} tokens each, on "
             f"{os.cpu_count()} shared CPU cores; bytes per machine against DDP's ring all-reduce of fp32 gradients "
             "at the same global batch", "", *provenance.table(header, body)]
    print("\n".join(lines))
    (out / "bench_federated.json").write_text(json.dumps({
        "tokens": args.tokens, "inner_steps": args.inner_steps, "seconds": seconds,
        "machine_batch": {label: batch for label, (_, batch) in batches.items()},
        "outer_lr": args.outer_lr, "outer_momentum": args.outer_momentum, "seed": args.seed,
        "in_process": args.in_process,
        "bpc": {f"{k[0]} | {k[1]}": v for k, v in bpc.items()}, "summaries": summaries}, indent=1, default=str))


if __name__ == "__main__":
    main()
