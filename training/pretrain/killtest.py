"""`hitoban killtest`: prove that a hard crash loses nothing (docs/design.md §8), before trusting a night to it.

It runs the night's *exact* configuration (every `hitoban pretrain` option, one argument definition for both; only
the length and the save/log cadence differ), each run a real `hitoban pretrain` subprocess on real shards:
  [B] batch determinism: this process and a child build the batches for steps 1, 7, 4242, 100000; equal hashes
  [A] restore: the state a run held *in memory* just before its last save (a digest of every weight, m, v, step
      and lr) must equal what a fresh process loads from that checkpoint
  noise floor: two uninterrupted runs; max |weight difference| (0 on CPU, > 0 on GPUs)
  [C] a run SIGKILLed twice (once *inside* a save, between the weights and COMPLETE), then resumed to the end
  [D] loss-curve step between the killed and the uninterrupted run, skipping log windows cut by a resume
  control: resume with the optimizer state deleted; the comparison must see the difference
Pass with noise 0 (CPU): killed == uninterrupted bit for bit, loss step 0, control detected. Pass with noise > 0
(GPUs, 3LM's rule): killed diff <= 3x noise, loss step <= 0.05, control >= 10x noise. `hitoban demo` runs this
same harness; killtest.json has one schema.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from hitoban.errors import UsageError
from hitoban.modeling import HitobanConfig, HitobanForCausalLM
from hitoban.modeling.loading import device_for
from hitoban.options import argv_for, checked_against, flag_of
from hitoban.provenance import weights_sha256, write_json
from hitoban.run_folder import RunFolder
from hitoban.training import faults
from hitoban.training.data.reader import ShardReader
from hitoban.training.optim import SCALER_PREFIX, AdamW
from hitoban.training.pretrain.checkpoint import (
    TrainState,
    current_slot,
    drop_optimizer_state,
    load_checkpoint,
    state_digest,
)
from hitoban.training.pretrain.options import KillTestOptions, PretrainConfig


def batch_hash(data: str | os.PathLike) -> str:
    """Hash of the batches for steps 1, 7, 4242, 100000: computed here and in a child process, they must match."""
    reader = ShardReader(data)
    return hashlib.sha256(b"".join(reader.batch(4242, s, 4, 32).tobytes() for s in (1, 7, 4242, 100000))).hexdigest()


def restore_check(slot: Path, digest_file: Path) -> dict:
    """Check [A]: load `slot` into freshly built objects and compare their digest with the in-memory one."""
    model = HitobanForCausalLM(HitobanConfig.from_pretrained(slot))
    optimizer = AdamW(model.parameters())
    with safe_open(str(slot / "optimizer.safetensors"), "pt") as f:  # an fp16 run's slot holds its scaler too
        scaler = torch.amp.GradScaler("cpu") if any(k.startswith(SCALER_PREFIX) for k in f.keys()) else None
    state, _ = load_checkpoint(slot, model, optimizer, scaler)
    before, after = json.loads(Path(digest_file).read_text()), state_digest(model, optimizer, scaler)
    bad = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return {"exact": not bad, "mismatches": bad[:10], "tensors": len(before), "step": state.step,
            "lr": optimizer.param_groups[0]["lr"]}


VERIFY_RESTORE = """
import json, sys
from pathlib import Path
from hitoban.training.pretrain.killtest import batch_hash, restore_check
print(json.dumps({"batch_hash": batch_hash(sys.argv[3]), **restore_check(Path(sys.argv[1]), Path(sys.argv[2]))}))
"""


def _final_tensors(run: Path) -> dict[str, torch.Tensor]:
    slot = current_slot(run)
    tensors = load_file(str(slot / "model.safetensors"))
    tensors.update({f"opt.{k}": v for k, v in load_file(str(slot / "optimizer.safetensors")).items()})
    return tensors


def max_weight_diff(a: Path, b: Path) -> float:
    ta, tb = _final_tensors(a), _final_tensors(b)
    return max((ta[k].double() - tb[k].double()).abs().max().item() for k in ta if not k.startswith("opt."))


def bit_identical(a: Path, b: Path) -> bool:
    ta, tb = _final_tensors(a), _final_tensors(b)
    return ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def train_losses(run: Path) -> tuple[dict[int, float], list[int]]:
    losses, resumes = {}, []
    for record in RunFolder(run).records():
        if record["type"] == "train":
            losses[record["step"]] = record["loss"]
        elif record["type"] == "resume":
            resumes.append(record["step"])
    return losses, resumes


def loss_step(base: Path, other: Path, log_every: int) -> tuple[float, list[int], list[int]]:
    """Max |train-loss difference| at shared logged steps, excluding windows a resume cut short (3LM's fix)."""
    a, _ = train_losses(base)
    b, resumed_at = train_losses(other)
    excluded = sorted(s for s in b if any(s - log_every < m < s for m in resumed_at))
    compared = sorted(s for s in set(a) & set(b) if s not in excluded)
    gap = max((abs(a[s] - b[s]) for s in compared), default=0.0)
    return gap, compared, excluded


def runs_in_parallel(options: list[str], device_type: str | None = None) -> bool:
    """Two of the harness's runs at once only on the CPU (one thread each, separate cores): on a GPU two nights of
    the same shape need twice the memory, which a 12-24 GB card does not have."""
    if device_type is None:
        device_type = device_for(flag_of(PretrainConfig, "cpu") in options).type
    return device_type == "cpu"


HARNESS_DEFAULTS = {"eval_batches": 2}  # overridable by the night's options; the cadence below is the harness's own
_KILLTEST = KillTestOptions(data="")


@checked_against(KillTestOptions, "steps", "kills")
def run_killtest(data: str | os.PathLike, work: str | os.PathLike, options: list[str] | None = None,
                 steps: int = _KILLTEST.steps, kills: int = _KILLTEST.kills,
                 killed_run: str | os.PathLike | None = None, log=print, plant_fault: str | None = None) -> dict:
    """Run the protocol with the `hitoban pretrain` options `options` (the night's); returns killtest.json's
    content. `killed_run` places the killed-and-resumed run (the demo keeps it as its model). `plant_fault`
    ("drop-optimizer-state"): the killed run resumes without its optimizer state, as a broken resume would; the
    test must then fail (`hitoban doctor --plant-fault` proves it can)."""
    work = Path(work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    options = list(options or [])
    log_every = 5
    defaults = {**HARNESS_DEFAULTS, "eval_every": steps}
    base_args = ([sys.executable, "-m", "hitoban.cli", "pretrain", *argv_for(PretrainConfig, data=str(data)), *options,
                  *argv_for(PretrainConfig, **{name: value for name, value in defaults.items()
                                               if flag_of(PretrainConfig, name) not in options}),
                  *argv_for(PretrainConfig, steps=steps, log_every=log_every, save_every_steps=5, progress=False,
                            resume="auto")])
    # One thread per run: every run does the same arithmetic (bit-exact comparisons need equal thread counts) and
    # independent runs can go in parallel on separate cores.
    # On a GPU: deterministic kernels (cuBLAS workspace, no atomics), so the same device can be held to bit-exactness;
    # where that is impossible (MPS) the noise-floor rule below judges instead.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           **faults.to_env(deterministic=True), "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    digests = work / "state-digests"
    digests.mkdir()

    def pretrain(out: Path, hooks: dict | None = None, **popen):
        """A `hitoban pretrain` run into `out`; `hooks`: training/faults.py's hooks for it, over deterministic."""
        run_env = {**env, **faults.to_env(deterministic=True, **(hooks or {}))}
        return subprocess.Popen(base_args + argv_for(PretrainConfig, out=str(out)), env=run_env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)

    parallel = runs_in_parallel(options)

    def run_to_end(*runs: tuple[Path, dict | None]) -> None:
        pending = list(runs)
        while pending:  # independent runs go in parallel on CPU cores; one at a time on a GPU (its memory)
            batch, pending = (pending, []) if parallel else (pending[:1], pending[1:])
            for out, proc in [(out, pretrain(out, extra)) for out, extra in batch]:
                finish(out, proc)

    started = time.time()
    uninterrupted = [(work / "base1", {"state_digest_dir": str(digests)}), (work / "base2", None)]
    if not parallel:
        run_to_end(*uninterrupted)
    killed = Path(killed_run) if killed_run else work / "killed"
    shutil.rmtree(killed, ignore_errors=True)
    control_source = work / "noopt"
    # On the CPU each uninterrupted run trains beside one killed attempt (its own core): the harness's chain of
    # process start-ups is three long instead of five
    kill_steps = self_kill(killed, kills, log_every, pretrain, control_source, log,
                           beside=uninterrupted if parallel else [])
    noise = max_weight_diff(work / "base1", work / "base2")
    log(f"noise floor (two uninterrupted runs): {noise:.3e}")

    verify = _start_restore_check(work / "base1", digests, data, env)
    try:
        drop_optimizer_state(current_slot(control_source))  # re-sealed: deleting it by hand is damage (issue 35)
        if plant_fault == "drop-optimizer-state":
            drop_optimizer_state(current_slot(killed))
        elif plant_fault is not None:
            raise UsageError(f"unknown fault {plant_fault!r}; the one known is drop-optimizer-state")
        run_to_end((killed, None), (control_source, None))
        restore, batch_ok = _restore_result(verify, data, log)
    finally:
        if verify.poll() is None:
            verify.kill()
            verify.communicate()
    return _judge(work, killed, control_source, noise, restore, batch_ok, kill_steps, kills, options, steps,
                  log_every, started, log)


def _start_restore_check(base: Path, digests: Path, data, env: dict) -> subprocess.Popen:
    """[A] and [B] on `base`'s last save, on the CPU in a process of its own (it runs beside the last resumes)."""
    slot = current_slot(base)
    digest = digests / f"step-{TrainState.read(slot).step}.json"
    return subprocess.Popen([sys.executable, "-c", VERIFY_RESTORE, str(slot), str(digest), str(data)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env, "CUDA_VISIBLE_DEVICES": ""})


def _restore_result(verify: subprocess.Popen, data, log) -> tuple[dict, bool]:
    """The restore check's finding, and whether the child built the batches this process builds."""
    output, errors = verify.communicate()
    if verify.returncode:
        raise RuntimeError(f"the restore check failed:\n{errors[-3000:]}")
    restore = json.loads(output)
    batch_ok = restore.pop("batch_hash") == batch_hash(data)
    log(f"[B] batch determinism across processes: {'ok' if batch_ok else 'FAILED'}")
    log(f"[A] in-memory state before the save vs a fresh process's reload: "
        f"{'bit-exact' if restore['exact'] else 'MISMATCH ' + str(restore['mismatches'])} ({restore['tensors']} "
        f"tensors, step {restore['step']}, lr {restore['lr']:.3e})")
    return restore, batch_ok


def finish(out: Path, proc: subprocess.Popen) -> None:
    """Wait for a harness run; its output's tail in the error where it failed."""
    output, _ = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"pretrain in {out.name} failed:\n{output[-3000:]}")


def self_kill(killed: Path, kills: int, log_every: int, pretrain, first_copy: Path, log,
              beside: list[tuple[Path, dict | None]] = ()) -> list[int]:
    """SIGKILL the run `kills` times (the first inside a save, after a complete checkpoint exists); copies the run
    as the first kill left it to `first_copy` (the control resumes from there without optimizer state). `beside`:
    independent runs, one started with each attempt and `finish`ed after it (those left over, after the last)."""
    kill_steps, waiting = [], list(beside)
    for attempt in range(kills):
        mid_save = attempt == 0
        companion = (waiting[0][0], pretrain(*waiting.pop(0))) if waiting else None
        try:
            kill_steps.append(_kill_once(killed, mid_save, kill_steps, log_every, pretrain))
        except BaseException:
            if companion is not None:  # no orphan training on after the harness failed
                companion[1].kill()
                companion[1].communicate()
            raise
        if companion is not None:
            finish(*companion)
        log(f"[C] SIGKILL {attempt + 1}{' during a save' if mid_save else ''}: last complete checkpoint at step "
            f"{kill_steps[-1]}" + (f"; half-written slot left: {sorted(p.name for p in killed.glob('ckpt-*'))}"
                                   if mid_save else ""))
        if attempt == 0:
            shutil.copytree(killed, first_copy)
    for out, hooks in waiting:
        finish(out, pretrain(out, hooks))
    return kill_steps


def _kill_once(killed: Path, mid_save: bool, kill_steps: list[int], log_every: int, pretrain) -> int:
    """One attempt: start (or resume) the run, SIGKILL it inside a save or two log windows on; the step it kept."""
    proc = pretrain(killed, {"pause_in_save": 1} if mid_save else None)
    deadline = time.time() + 600
    while proc.poll() is None and time.time() < deadline:
        if mid_save and (killed / "SAVING").exists():
            try:  # kill inside a save that has a complete checkpoint before it (needed by the control)
                if int((killed / "SAVING").read_text()) > 5:
                    break
            except (ValueError, FileNotFoundError):  # half-written, or the save ended between the two looks
                pass
        if not mid_save and (killed / "log.jsonl").exists():
            steps_logged, _ = train_losses(killed)
            if steps_logged and max(steps_logged) >= (kill_steps[-1] if kill_steps else 0) + 2 * log_every:
                break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    slot = current_slot(killed)
    if slot is None:
        raise UsageError("the first kill came before any checkpoint; use more --steps")
    return TrainState.read(slot).step


def _judge(work: Path, killed: Path, control: Path, noise: float, restore: dict, batch_ok: bool,
           kill_steps: list[int], kills: int, options: list[str], steps: int, log_every: int, started: float,
           log) -> dict:
    identical = bit_identical(work / "base1", killed)
    killed_diff = max_weight_diff(work / "base1", killed)
    resumes = TrainState.read(current_slot(killed)).resumes
    gap, compared, excluded = loss_step(work / "base1", killed, log_every)
    log(f"[C] killed {kills}x, resumed {resumes}x: {'bit-identical' if identical else 'DIFFERENT'} to the "
        f"uninterrupted run (max |diff| {killed_diff:.3e}); [D] loss step {gap:.2e} over {len(compared)} "
        f"logged steps (excluded {excluded})")
    control_diff = max_weight_diff(work / "base1", control)
    control_gap, _, _ = loss_step(work / "base1", control, log_every)
    log(f"control (optimizer state deleted): max |diff| {control_diff:.3e}, loss gap {control_gap:.3e}")
    exact_mode = noise == 0.0
    checks = {
        "batch_deterministic": batch_ok,
        "restore_exact": bool(restore["exact"]),
        "killed_run_matches": identical if exact_mode else killed_diff <= 3.0 * noise,
        "loss_step_ok": gap == 0.0 if exact_mode else gap <= 0.05,
        "control_detected": control_diff > 0.0 if exact_mode else control_diff >= 10.0 * noise,
        "resumed": resumes >= kills,
    }
    config = RunFolder(work / "base1").config()  # the fingerprint and hardware, as either schema wrote them
    result = {"kind": "kill-test", "schema": 2, "steps": steps, "options": options,
              "fingerprint": config.get("fingerprint"), "hardware": config.get("hardware"),
              "weights_sha256": weights_sha256(current_slot(work / "base1")),  # what the killed run must equal
              "mode": "bit-exact (noise 0)" if exact_mode else "noise-relative (3LM: <= 3x noise, control >= 10x)",
              "batch_deterministic": batch_ok, "noise": noise, "restore": restore, "kills": kills,
              "killed_at_steps": kill_steps, "resumes": resumes, "killed_diff": killed_diff,
              "killed_bit_identical": identical, "loss_step": gap, "loss_compared_steps": compared,
              "loss_excluded_steps": excluded, "control_diff": control_diff, "control_loss_gap": control_gap,
              "checks": checks, "passed": all(checks.values()), "seconds": round(time.time() - started, 1)}
    write_json(work / "killtest.json", result)
    return result
