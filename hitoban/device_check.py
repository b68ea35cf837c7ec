"""`hitoban doctor`: the device check to run before the night, and the first thing to run on any GPU.

On the device and precision `--precision auto` picks (`hardware.plan_device`), it runs the night's own code, small:
corpus -> tokenizer -> shards from the built-in text; the kill test's harness (the real `hitoban pretrain` in
subprocesses: A/B saves, SIGKILL once inside a save and once between, resume, a dropped-optimizer control; bit-exact
on a CPU, 3LM's noise-floor rule on GPUs); an in-process night with `--compile auto`; the memory preflight's
estimate against a step's measured peak, at a shape where the logits dominate (an estimate without them must fall
short); the restored optimizer state's placement after a resume; the real bits/char on held-out text; and
generation with the KV-cache check. One table, one line per check; any failure
raises CheckFailed (exit 1). `hitoban doctor --cpu` is the quick install check (`hitoban.doctor`).
Lazy imports: each check imports what it measures when it runs, so `hitoban doctor --help` starts without torch."""

from __future__ import annotations

import dataclasses
import functools
import math
import shutil
import time
from pathlib import Path

from hitoban.errors import CheckFailed
from hitoban.options import argv_for, checked_against
from hitoban.provenance import write_json
from hitoban.run_folder import RunFolder
from hitoban.start_options import DEVICE_CHECK_STEPS, DoctorOptions

HELD_OUT = 4  # built-in documents kept out of the corpus, for bits/char
CONTEXT, BATCH, STEPS = 64, 8, DEVICE_CHECK_STEPS
LATER_CHECKS = ("night in-process", "memory estimate", "resume placement", "bits/char", "generation")


@dataclasses.dataclass
class Check:
    name: str
    passed: bool | None  # None: not measurable on this device (said so, never counted as a pass)
    detail: str
    seconds: float = 0.0


class Table:
    def __init__(self, log):
        self.log, self.checks = log, []

    def run(self, name: str, fn) -> object:
        """fn() -> (passed, detail, value); an exception is a failed check with its message."""
        started = time.time()
        try:
            passed, detail, value = fn()
        except Exception as error:  # noqa: BLE001 - every failure becomes a line of the table
            passed, detail, value = False, f"{type(error).__name__}: {str(error).splitlines()[0][:300]}", None
        check = Check(name, passed, detail, round(time.time() - started, 1))
        self.checks.append(check)
        mark = {True: "ok", False: "FAIL", None: "n/a"}[passed]
        self.log(f"{name:<22} {mark:<5} {detail}  ({check.seconds:.1f} s)")
        return value

    def markdown(self) -> str:
        rows = [f"| {c.name} | {'ok' if c.passed else 'n/a' if c.passed is None else 'FAIL'} | "
            f"{c.detail.replace('|', '/')} | "
                f"{c.seconds} |" for c in self.checks]
        return "\n".join(["| check | result | detail | seconds |", "|---|---|---|---|", *rows])


def _data(out: Path, seed: int):
    from hitoban.training.data.corpus import build_corpus, builtin_documents, local_source
    from hitoban.training.data.filters import FilterSettings
    from hitoban.training.data.shards import build_shards, verify_shards
    from hitoban.training.data.tokenizer import train_tokenizer_from_corpus

    documents = builtin_documents()
    train, held_out = documents[:-HELD_OUT], documents[-HELD_OUT:]
    text = out / "builtin.txt"
    text.write_text("\n".join(d.replace("\n", " ") for d in train) + "\n", encoding="utf-8")
    # near-duplicate detection (MinHash) is text work on the CPU, not a device path: off, so the check needs only
    # what training needs
    build_corpus([local_source([str(text)], name="builtin", license="Apache-2.0")], out / "corpus", seed=seed,
                 settings=FilterSettings(min_chars=50, near_dup_threshold=None), progress=False)
    train_tokenizer_from_corpus(out / "corpus", out / "tokenizer", vocab_size=1200, seed=seed,
                                model_max_length=2 * CONTEXT, hard_vocab_limit=False)
    build_shards(out / "corpus", out / "tokenizer", out / "shards", shard_tokens=20_000, val_every=8,
                 context=CONTEXT, seed=seed, progress=False)
    splits = verify_shards(out / "shards", out / "tokenizer", full=True)["splits"]
    return True, f"{', '.join(f'{k} {v:,} tokens' for k, v in splits.items())}; verified", "\n".join(held_out)


def _options(cpu: bool, seed: int) -> list[str]:
    """The doctor night's `hitoban pretrain` options: auto precision, eager (compile is the in-process run's)."""
    from hitoban.training.pretrain.options import PretrainConfig

    return argv_for(PretrainConfig, preset="tiny", batch_size=BATCH, context=CONTEXT, lr=3e-3, warmup_frac=0.05,
                    seed=seed, eval_every=20, eval_batches=2, compile="off", cpu=cpu)


def _killtest(out: Path, cpu: bool, seed: int, steps: int, plant_fault: str | None):
    from hitoban.training.pretrain.killtest import run_killtest

    result = run_killtest(out / "shards", out / "killtest", _options(cpu, seed), steps=steps, kills=2,
                          killed_run=out / "run", log=lambda *_: None, plant_fault=plant_fault)
    failed = [name for name, ok in result["checks"].items() if not ok]
    same = ("bit-identical" if result["killed_bit_identical"] else
            f"max abs diff {result['killed_diff']:.1e} vs noise {result['noise']:.1e}")
    detail = (f"SIGKILLed at steps {result['killed_at_steps']} (once mid-save), resumed {result['resumes']}x: {same}; "
              f"loss step {result['loss_step']:.1e}; control diff {result['control_diff']:.1e}"
              + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return result["passed"], detail, result


def _night_in_process(out: Path, cpu: bool, seed: int, steps: int):
    """The loop in this process, `--compile auto`: it finishes and learns."""
    from hitoban.training.pretrain.trainer import pretrain

    summary = pretrain(_night_config(out, cpu, seed, steps, resume="never"))
    plan = _recorded_plan(out / "night")
    night = (f"{summary['steps']} steps, best val loss {summary['best_val']:.3f}, precision "
             f"{plan['precision_used']}, Muon's Newton-Schulz in {plan['muon_dtype']}, compile {plan['compile']}")
    return summary["steps"] == steps and math.isfinite(summary["best_val"] or math.nan), night, summary


MEMORY_VOCAB = 32000  # the 3lm vocabulary: at the tiny width, the logits are most of what a step holds


def judge_memory(estimate: int, without_logits: int, peak: int | None, how: str) -> tuple[bool | None, str]:
    """The estimate passes when it covers the measured peak, and only where the measurement could catch it out: an
    estimate without its logits term (the negative control) must fall short of the same peak, or the shape cannot
    tell a right estimate from a wrong one and nothing is certified."""
    mib = 2**20
    if peak is None:
        return None, f"{how}: not compared (estimate {estimate / mib:.0f} MiB)"
    detail = (f"measured peak {peak / mib:.0f} MiB ({how}), estimate {estimate / mib:.0f} MiB, without its logits "
              f"{without_logits / mib:.0f} MiB")
    if estimate < peak:
        return False, detail + ": UNDERESTIMATED"
    if without_logits >= peak:
        return False, detail + ": an estimate without the logits also covers this peak, so it certifies nothing"
    return True, detail


def _memory(cpu: bool):
    """A step's measured peak against the preflight's estimate, at a shape where the logits dominate (the doctor
    night's batch and context, the 3lm vocabulary) after a warm-up (`budget.step_peak_bytes`)."""
    from hitoban.modeling import HitobanConfig
    from hitoban.training.device import set_up
    from hitoban.training.memory import estimate_memory_bytes, logits_bytes
    from hitoban.training.pretrain.budget import step_peak_bytes
    from hitoban.training.step import reset_accelerate_state

    config = HitobanConfig.from_preset("tiny", vocab_size=MEMORY_VOCAB)
    reset_accelerate_state(cpu=cpu)
    device = set_up(cpu, "auto")  # the night's resolution: what `--precision auto` runs here
    plan, accelerator = device.plan, device.accelerator
    try:
        peak, how = step_peak_bytes(config, BATCH, CONTEXT, accelerator, muon_dtype=plan.muon_dtype)
    finally:
        accelerator.free_memory()
        reset_accelerate_state(cpu=cpu)
    estimate = estimate_memory_bytes(config, BATCH, CONTEXT, plan.precision)
    passed, detail = judge_memory(estimate, estimate - logits_bytes(config, BATCH, CONTEXT, plan.precision), peak, how)
    return passed, f"{plan.precision}, tiny at vocab {MEMORY_VOCAB:,} b{BATCH} ctx{CONTEXT}: {detail}", peak


def _night_config(out: Path, cpu: bool, seed: int, steps: int, **options):
    """The in-process night's options (the placement check resumes the same trajectory)."""
    from hitoban.training.pretrain.options import PretrainConfig

    return PretrainConfig(data=str(out / "shards"), out=str(out / "night"), preset="tiny", context=CONTEXT,
                          batch_size=BATCH, steps=steps, lr=3e-3, warmup_frac=0.05, seed=seed, eval_every=steps,
                          eval_batches=2, log_every=10, progress=False, cpu=cpu, **options)


def _recorded_plan(run: Path) -> dict:
    return RunFolder(run).records("device")[0]


def _placement(out: Path, cpu: bool, seed: int, steps: int):
    """Build the night again over its checkpoint (a resume) and check where the restored optimizer state sits."""
    from hitoban.training.pretrain.resume import check_state_placement
    from hitoban.training.pretrain.trainer import Trainer
    from hitoban.training.step import reset_accelerate_state

    run = None
    try:
        run = Trainer(_night_config(out, cpu, seed, steps, compile="off"))
        check_state_placement(run.optimizer)
        tensors = sum(1 for s in run.optimizer.state.values() for v in s.values() if hasattr(v, "device"))
        return run.resumed_from is not None, f"resumed from {run.resumed_from.name}: {tensors} state tensors on " \
                                             f"their optimizer's devices", None
    finally:
        if run is not None:
            run.close()
        reset_accelerate_state()


def _bpc(model, tokenizer, held_out: str):
    from hitoban.evaluation.bpc import bits_per_char

    result = bits_per_char(model, tokenizer, held_out, name="held-out built-in prose", window=CONTEXT)
    tokens = len(tokenizer(held_out, add_special_tokens=False)["input_ids"])
    uniform = math.log2(len(tokenizer)) * tokens / len(held_out)  # a model that learnt nothing
    bpc = result["bits_per_char"]
    return bpc < uniform, f"{bpc:.3f} bits/char on {len(held_out):,} held-out chars (uniform: {uniform:.3f})", bpc


def _generation(model, tokenizer):
    import torch

    from hitoban.evaluation.kvcache import check_kvcache

    kv = check_kvcache(model)  # the killed-and-resumed run's final model, on the checked device
    prompt = tokenizer("夜の研究室は", return_tensors="pt").to(model.device)
    with torch.no_grad():
        ids = model.generate(**prompt, max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    text = tokenizer.decode(ids[0], skip_special_tokens=True)
    return kv["passed"] and ids.shape[1] > prompt["input_ids"].shape[1], (
        f"KV cache vs full forward: max abs diff {kv['max_abs_diff']:.1e} over {kv['positions_checked']} positions; "
        f"greedy: {text!r}"), text


@checked_against(DoctorOptions, "steps", "seed")
def run_device_check(out: str | Path = "hitoban-doctor", cpu: bool = False, seed: int = 0, steps: int = STEPS,
                     plant_fault: str | None = None, log=print) -> dict:
    """Run every check; returns the report (also out/doctor.json and out/doctor.md). Raises CheckFailed if any
    check failed."""
    from hitoban.modeling.loading import device_for
    from hitoban.training.hardware import plan_for

    started = time.time()
    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    table = Table(log)
    device = device_for(cpu)
    plan = plan_for(device)
    table.run("device", lambda: (True, f"{device.type}: {plan.why}", plan.record()))
    held_out = table.run("data", lambda: _data(out, seed))
    if held_out is not None:
        table.run("kill and resume", lambda: _killtest(out, cpu, seed, steps, plant_fault))
    if held_out is not None and plant_fault is None:
        table.run("night in-process", lambda: _night_in_process(out, cpu, seed, steps // 4))
        table.run("memory estimate", lambda: _memory(cpu))
        table.run("resume placement", lambda: _placement(out, cpu, seed, steps // 4))
        if (out / "run" / "final").exists():
            from hitoban.modeling.loading import load_model_and_tokenizer

            final = functools.cache(lambda: load_model_and_tokenizer(out / "run" / "final", device=device))
            table.run("bits/char", lambda: _bpc(*final(), held_out))
            table.run("generation", lambda: _generation(*final()))
    not_run = list(LATER_CHECKS) if plant_fault else []
    if not_run:  # the fault is planted in the kill test: the checks after it would measure nothing about it
        log(f"--plant-fault {plant_fault}: not run: {', '.join(not_run)}")
    report = {"kind": "device-check", "schema": 1, "device": device.type, "plan": plan.record(),
              "plant_fault": plant_fault, "checks": [dataclasses.asdict(c) for c in table.checks], "not_run": not_run,
              "passed": not not_run and all(c.passed is not False for c in table.checks),  # a control certifies nothing
              "seconds": round(time.time() - started, 1)}
    write_json(out / "doctor.json", report)
    (out / "doctor.md").write_text(table.markdown() + "\n" + (f"\nNot run (--plant-fault {plant_fault}): "
                                                              f"{', '.join(not_run)}\n" if not_run else ""),
                                   encoding="utf-8")
    failed = [c.name for c in table.checks if c.passed is False]
    if plant_fault and not failed:
        raise CheckFailed(f"hitoban doctor --plant-fault {plant_fault}: the kill test did not see the planted fault, "
                          f"so it cannot be trusted to see a real one (see {out}/doctor.md)")
    if failed:
        raise CheckFailed(f"hitoban doctor failed on {device.type}: {', '.join(failed)} (see {out}/doctor.md)")
    return report
