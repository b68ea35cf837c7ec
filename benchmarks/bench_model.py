"""HitobanForCausalLM vs HF LlamaForCausalLM of the same shape, side by side in one process (docs/design.md §17).

Rows: training step (forward + backward + AdamW) tok/s in fp32 and bf16 autocast, greedy `generate()` tok/s at
batch 1 and 8, peak memory of a training step (RSS growth in a fresh process per model, median of
--memory-samples), and MFU against a matmul peak measured in the same run.
Runs alternate between the two models (A B A B ...) and the best of N is kept, so drift on a shared machine hits
both alike. Absolute numbers swing between runs: read the ratios.

    python benchmarks/bench_model.py                     # the docs/design.md §17 shape: 4L/256/4H, vocab 8000,
                                                         # ctx 256, batch 8
    python benchmarks/bench_model.py --preset 3lm --batch 4 --ctx 512
    python benchmarks/bench_model.py --preset 3lm --batch 32 --ctx 512 --compile   # a GPU (CUDA or MPS): same script

The device is CUDA, else MPS, else the CPU (`--device` to choose). `--compile` adds torch.compile rows for both
models. The row "hitoban default vs llama fp32" compares hitoban in the machine's default precision (`--precision
auto`) with Llama eager fp32: what a night gains over a plain Trainer run on the same machine. The row "chat decode
vs generate b1" puts hitoban's chat loop (column: hitoban) against `generate` on the same hitoban model (column:
llama).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import provenance
import torch

from hitoban import HitobanConfig, HitobanForCausalLM
from hitoban.modeling.export_llama import to_llama
from hitoban.training.hardware import synchronize

DEVICE = torch.device("cpu")


def sync() -> None:
    synchronize(DEVICE)


def matmul_peak(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    """Best FLOP/s of an n x n matmul: the denominator of MFU on this machine."""
    n = n if DEVICE.type == "cpu" else max(n, 8192)
    a, b = torch.randn(n, n, dtype=dtype, device=DEVICE), torch.randn(n, n, dtype=dtype, device=DEVICE)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def train_flops_per_token(config: HitobanConfig, ctx: int) -> float:
    """6 N (non-embedding + tied output matmul) + attention 12 L d ctx (PaLM appendix B convention, causal ignored)."""
    width, layers = config.hidden_size, config.num_hidden_layers
    non_embedding = layers * (4 * width**2 + 3 * width * config.intermediate_size)
    output = config.hidden_size * config.vocab_size
    return 6 * (non_embedding + output) + 12 * config.num_hidden_layers * config.hidden_size * ctx


PEAK_MEMORY = """
import resource, sys, torch

def peak_kib():  # VmHWM belongs to this process's own address space; ru_maxrss survives exec from a big parent
    try:
        return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

from hitoban import HitobanConfig, HitobanForCausalLM
from hitoban.modeling.export_llama import to_llama
kind, preset = sys.argv[1], sys.argv[2]
vocab, ctx, batch, bf16 = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1"
torch.manual_seed(0)
model = HitobanForCausalLM(HitobanConfig.from_preset(preset, vocab_size=vocab, max_position_embeddings=max(ctx, 256)))
model = (to_llama(model) if kind == "llama" else model).train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, vocab, (batch, ctx))
base = peak_kib()
for _ in range(3):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(ids, labels=ids).loss
    loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)
print((peak_kib() - base) / 1024)
"""


def peak_memory_mib(kind: str, config: HitobanConfig, ctx: int, batch: int, bf16: bool) -> float:
    """Peak RSS growth over three training steps (activations, gradients, optimizer state) in a fresh process:
    allocator caches of the other model cannot hide or inflate anything. On CUDA: the allocator's own peak."""
    if DEVICE.type == "cuda":
        torch.manual_seed(0)
        model = HitobanForCausalLM(config)
        model = (to_llama(model) if kind == "llama" else model).to(DEVICE).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, config.vocab_size, (batch, ctx), device=DEVICE)
        torch.cuda.reset_peak_memory_stats(DEVICE)
        base = torch.cuda.memory_allocated(DEVICE)
        for _ in range(3):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                loss = model(ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return (torch.cuda.max_memory_allocated(DEVICE) - base) / 2**20
    if DEVICE.type != "cpu":
        return float("nan")  # MPS has no peak counter
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", PEAK_MEMORY, kind, config.name_or_path or "small",
                          str(config.vocab_size), str(ctx), str(batch), "1" if bf16 else "0"],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def time_train_step(model, optimizer, ids, autocast) -> float:
    sync()
    start = time.perf_counter()
    with autocast():
        loss = model(ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync()
    return time.perf_counter() - start


@torch.no_grad()
def time_generate(model, prompt, new_tokens) -> float:
    sync()
    start = time.perf_counter()
    model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                   min_new_tokens=new_tokens, do_sample=False, pad_token_id=3)
    sync()
    return time.perf_counter() - start


def alternate(fns: dict, repeats: int) -> tuple[dict, float]:
    """Run the two fns once per round, alternating, after one warm-up round.

    Returns the best time of each and the median over rounds of the paired ratio llama_time / hitoban_time:
    both halves of a pair see the same machine state, so the median ratio is robust to drift on a shared machine.
    """
    for fn in fns.values():
        fn()
    best = {name: float("inf") for name in fns}
    ratios = []
    for round_index in range(repeats):
        order = list(fns) if round_index % 2 == 0 else list(fns)[::-1]
        times = {name: fns[name]() for name in order}
        ratios.append(times["llama"] / times["hitoban"])
        for name, t in times.items():
            best[name] = min(best[name], t)
    return best, statistics.median(ratios)


def load_space_app():
    """spaces/app.py as a module (it is a standalone file, not part of the hitoban package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hitoban_space_app", Path(__file__).parents[1] / "spaces" / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab", type=int, default=None)
    parser.add_argument("--ctx", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--memory-samples", type=int, default=3,
                        help="fresh processes per model for the peak-memory rows, median kept (default: 3)")
    parser.add_argument("--bf16", action="store_true", help="run bf16 rows even where the CPU only emulates bf16")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", help="also write the table here")
    parser.add_argument("--device", help="cuda, mps or cpu (default: the best present)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd training steps")
    parser.add_argument("--no-space", action="store_true",
                        help="leave out the Space's decode row (spaces/app.py imports gradio)")
    args = parser.parse_args()
    global DEVICE
    from hitoban.modeling.loading import device_for
    from hitoban.training.hardware import default_precision

    DEVICE = torch.device(args.device) if args.device else device_for()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    overrides = {"max_position_embeddings": max(args.ctx, 256)}
    if args.vocab:
        overrides["vocab_size"] = args.vocab
    config = HitobanConfig.from_preset(args.preset, **overrides)
    config.name_or_path = args.preset  # the peak-memory subprocess rebuilds the same shape from the preset
    ours = HitobanForCausalLM(config)
    llama = to_llama(ours)  # same weights, so both do the same work on the same numbers
    ours, llama = ours.to(DEVICE), llama.to(DEVICE)
    models = {"hitoban": ours, "llama": llama}
    ids = torch.randint(0, config.vocab_size, (args.batch, args.ctx), device=DEVICE)
    tokens = ids.numel()
    peaks = {"fp32": matmul_peak(torch.float32)}
    # Probe bf16 on a small matrix first: emulated bf16 (no AVX512-BF16/AMX) takes minutes at full size.
    probe = matmul_peak(torch.bfloat16, n=256, repeats=2)
    peaks["bf16"] = (matmul_peak(torch.bfloat16) if probe > peaks["fp32"] / 4 or args.bf16 or DEVICE.type != "cpu"
                     else probe)
    flops = train_flops_per_token(config, args.ctx)
    rows = []

    precisions = ["fp32"]
    if peaks["bf16"] > peaks["fp32"] / 2 or args.bf16:
        precisions.append("bf16")
    else:
        print(f"bf16 skipped: matmul peak {peaks['bf16'] / 1e9:.1f} GFLOP/s, this CPU has no native bf16 (use --bf16)")
    eager_tok_s = {}
    for precision in precisions:
        autocast = ((lambda: torch.autocast(DEVICE.type, dtype=torch.bfloat16)) if precision == "bf16"
                    else nullcontext)
        optimizers = {n: torch.optim.AdamW(m.parameters(), lr=1e-4) for n, m in models.items()}
        for m in models.values():
            m.train()
        best, ratio = alternate(
            {n: (lambda n=n, o=optimizers, a=autocast: time_train_step(models[n], o[n], ids, a)) for n in models},
            args.repeats,
        )
        eager_tok_s[precision] = {n: tokens / t for n, t in best.items()}
        if args.compile:
            compiled = {n: torch.compile(m) for n, m in models.items()}
            best_c, ratio_c = alternate(
                {n: (lambda n=n, o=optimizers, a=autocast, c=compiled: time_train_step(c[n], o[n], ids, a))
                 for n in models}, args.repeats)
            tok_c = {n: tokens / t for n, t in best_c.items()}
            rows.append({"row": f"train step {precision} compiled", "unit": "tok/s", **tok_c, "ratio": ratio_c,
                         "mfu_hitoban": tok_c["hitoban"] * flops / peaks[precision]})
            rows.append({"row": f"hitoban compiled vs llama eager {precision}", "unit": "tok/s",
                         "hitoban": tok_c["hitoban"], "llama": tokens / best["llama"],
                         "ratio": tok_c["hitoban"] / (tokens / best["llama"])})
        memory = {n: statistics.median(peak_memory_mib(n, config, args.ctx, args.batch, precision == "bf16")
                                       for _ in range(args.memory_samples)) for n in models}
        tok_s = {n: tokens / t for n, t in best.items()}
        rows.append({"row": f"train step {precision}", "unit": "tok/s", **tok_s, "ratio": ratio,
                     "mfu_hitoban": tok_s["hitoban"] * flops / peaks[precision]})
        rows.append({"row": f"peak memory {precision}", "unit": "MiB", **memory,
                     "ratio": memory["llama"] / memory["hitoban"]})

    default = "bf16" if default_precision(DEVICE.type) == "bf16" and "bf16" in eager_tok_s else "fp32"
    rows.append({"row": f"hitoban default ({default}) vs llama fp32", "unit": "tok/s",
                 "hitoban": eager_tok_s[default]["hitoban"], "llama": eager_tok_s["fp32"]["llama"],
                 "ratio": eager_tok_s[default]["hitoban"] / eager_tok_s["fp32"]["llama"]})
    for m in models.values():
        m.eval()
    for batch in (1, 8):
        prompt = torch.randint(4, config.vocab_size, (batch, 16), device=DEVICE)  # no padding: both take the same path
        best, ratio = alternate(
            {n: (lambda n=n, p=prompt: time_generate(models[n], p, args.new_tokens)) for n in models}, args.repeats
        )
        tok_s = {n: batch * args.new_tokens / t for n, t in best.items()}
        rows.append({"row": f"greedy generate batch {batch}", "unit": "tok/s", **tok_s, "ratio": ratio})

    # hitoban's chat loop (evaluation.generation.decode: same tokens as generate, tested) against generate, batch 1
    from transformers import LogitsProcessorList

    from hitoban.evaluation.generation import decode

    prompt = torch.randint(4, config.vocab_size, (1, 16), device=DEVICE)

    @torch.no_grad()
    def time_decode():
        sync()
        start = time.perf_counter()
        decode(ours, prompt, LogitsProcessorList(), False, [], args.new_tokens)
        sync()
        return time.perf_counter() - start

    best, ratio = alternate({"hitoban": time_decode, "llama": lambda: time_generate(ours, prompt, args.new_tokens)},
                            args.repeats)
    rows.append({"row": "chat decode vs generate b1", "unit": "tok/s", "hitoban": args.new_tokens / best["hitoban"],
                 "llama": args.new_tokens / best["llama"], "ratio": ratio})
    if default == "bf16":  # `hitoban chat` and the Space load bf16 weights here: both against plain fp32 generate
        fp32_generate = args.new_tokens / best["llama"]
        space = None if args.no_space else load_space_app()

        def time_space():
            sync()
            start = time.perf_counter()
            space.decode(ours, prompt, 0.0, 0, 1.0, args.new_tokens, [])  # greedy, as the rows above
            sync()
            return time.perf_counter() - start

        ours.to(torch.bfloat16)  # once, for both loops, interleaved round by round (alternate's two slots)
        loops = {"hitoban": time_decode, "llama": time_decode if space is None else time_space}
        best_bf16, _ = alternate(loops, args.repeats)
        ours.to(torch.float32)
        shown = (("chat bf16 vs generate fp32 b1", "hitoban"),) + (
            () if space is None else (("Space bf16 vs generate fp32 b1", "llama"),))
        for row, loop in shown:
            tok_s = args.new_tokens / best_bf16[loop]
            rows.append({"row": row, "unit": "tok/s", "hitoban": tok_s, "llama": fp32_generate,
                         "ratio": fp32_generate and tok_s / fp32_generate})
    # The peak is the best of a measurement before and after the rows: a busy moment must not inflate MFU.
    for precision in precisions:
        fresh = matmul_peak(torch.float32 if precision == "fp32" else torch.bfloat16)
        if fresh > peaks[precision]:
            for row in rows:
                if "mfu_hitoban" in row and row["row"].endswith(precision):
                    row["mfu_hitoban"] *= peaks[precision] / fresh
            peaks[precision] = fresh
    total = sum(p.numel() for p in ours.parameters())
    print(f"shape: {args.preset} {config.num_hidden_layers}L/{config.hidden_size}/{config.num_attention_heads}H "
          f"vocab {config.vocab_size} ctx {args.ctx} batch {args.batch}, {total / 1e6:.2f}M params, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {DEVICE}")
    print(f"matmul peak: fp32 {peaks['fp32'] / 1e9:.0f} GFLOP/s, bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s")
    print(f"{'row':<32}{'hitoban':>10}{'llama':>10}{'ratio':>8}  (best-of tok/s; ratio = median paired "
          "speed-up, > 1: hitoban better)")
    for row in rows:
        mfu = f"  MFU {row['mfu_hitoban']:.1%}" if "mfu_hitoban" in row else ""
        print(f"{row['row'] + ' (' + row['unit'] + ')':<32}{row['hitoban']:>10,.0f}{row['llama']:>10,.0f}"
              f"{row['ratio']:>8.2f}{mfu}")
    print("\nFor docs/benchmarks.md:\n")
    print("\n".join(provenance.table(["measurement", "hitoban", "Llama / plain `generate`", "ratio"], [
        [f"{row['row']} ({row['unit']}{', MFU' if 'mfu_hitoban' in row else ''})",
         f"{row['hitoban']:,.0f}" + (f", {row['mfu_hitoban']:.1%}" if "mfu_hitoban" in row else ""),
         f"{row['llama']:,.0f}", f"{row['ratio']:.2f}x"] for row in rows])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "peaks": peaks, "args": vars(args)}, f, indent=2)


if __name__ == "__main__":
    main()
