"""Crash-safe A/B checkpoints (docs/design.md §7).

RUN/CURRENT names the last good slot (`ckpt-A` or `ckpt-B`). A save always writes the *other* slot: model, optimizer
(step, m, v per parameter, in safetensors), config, tokenizer, train_state.json, then COMPLETE, each fsync'd, and
only then swaps CURRENT (temp file + fsync + os.replace + directory fsync). A crash or a full disk at any point
leaves CURRENT naming an intact slot. A slot without COMPLETE is never loaded: correctness is structural.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from hitoban.errors import HitobanError
from hitoban.modeling.loading import TOKENIZER_FILES
from hitoban.provenance import write_lineage

SLOTS = ("ckpt-A", "ckpt-B")
# Test hooks for the kill test: pause inside a save (after the weights, before COMPLETE) so a SIGKILL lands
# mid-save; and write a digest of the *in-memory* state just before each save, for check [A].
PAUSE_IN_SAVE_ENV = "HITOBAN_PAUSE_IN_SAVE"
STATE_DIGEST_ENV = "HITOBAN_STATE_DIGEST_DIR"
DETERMINISTIC_ENV = "HITOBAN_DETERMINISTIC"  # the kill test on a GPU: deterministic kernels, bit-exact resume


class CheckpointError(HitobanError, RuntimeError):
    """A checkpoint cannot be written or does not fit this run; the message says what to do."""


TRAIN_STATE_SCHEMA = 1


@dataclass
class TrainState:
    """`train_state.json`: what a checkpoint records beside weights and optimizer state, and what the loop carries
    from step to step. Its schema lives here, beside the code that writes and reads it."""

    run_id: str  # names this run in every model it exports (lineage.json) and in the card
    seed: int
    fingerprint: dict = field(default_factory=dict)  # the trajectory: a resume must match it (check_resumable)
    args: dict = field(default_factory=dict)  # every option of the run, for the record
    data_index_sha256: str = ""
    step: int = 0  # optimizer updates done
    tokens_seen: int = 0
    best_val: float | None = None
    elapsed_sec: float = 0.0  # training time over all sessions
    resumes: int = 0
    schema: int = TRAIN_STATE_SCHEMA

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, ensure_ascii=False)

    @classmethod
    def read(cls, slot: Path) -> TrainState:
        """A slot's state; keys this version does not know (a newer hitoban) are refused, not dropped."""
        data = json.loads((Path(slot) / "train_state.json").read_text())
        known = {f.name for f in dataclasses.fields(cls)}
        if data.get("schema", 1) > TRAIN_STATE_SCHEMA or set(data) - known:
            raise CheckpointError(f"{slot}/train_state.json was written by a newer hitoban (schema "
                                  f"{data.get('schema')}, fields {sorted(set(data) - known)}); upgrade to resume it")
        return cls(**data)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def current_slot(run: Path) -> Path | None:
    """The slot to resume from: CURRENT's if complete, else the other complete one, else None."""
    named = (run / "CURRENT").read_text().strip() if (run / "CURRENT").exists() else None
    order = [named] if named in SLOTS else []
    order += [s for s in SLOTS if s not in order]
    for name in order:
        slot = run / name
        if (slot / "COMPLETE").exists() and (slot / "model.safetensors").exists():
            return slot
    return None


STATE_NAMES = {"exp_avg": "m", "exp_avg_sq": "v", "momentum_buffer": "momentum"}  # AdamW's m, v; Muon's momentum


def optimizer_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Flatten optimizer state into `<param name>.m` / `.v` (AdamW) or `.momentum` (Muon) plus `step` and `lr`
    (3LM's optimizer.safetensors, extended)."""
    names = {id(p): n for n, p in model.named_parameters()}
    tensors: dict[str, torch.Tensor] = {}
    step = 0
    for group in optimizer.param_groups:
        tensors["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float64)
        for p in group["params"]:
            state = optimizer.state.get(p)
            if not state:
                continue
            for key, short in STATE_NAMES.items():
                if key in state:
                    tensors[f"{names[id(p)]}.{short}"] = state[key].detach().contiguous()
            if "step" in state:
                step = int(state["step"])
    tensors["step"] = torch.tensor(step, dtype=torch.int64)
    return tensors


def load_optimizer_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer, tensors: dict) -> int:
    """Restore every moment and the step bit for bit; returns the step. Missing entries are an error, not a silent
    reset."""
    step = int(tensors["step"])
    for name, p in model.named_parameters():
        saved = {key: tensors[f"{name}.{short}"] for key, short in STATE_NAMES.items() if f"{name}.{short}" in tensors}
        if not saved:
            raise CheckpointError(f"optimizer state has no moments for {name}")
        state = {key: value.clone() for key, value in saved.items()}
        if "exp_avg" in state:
            state["step"] = torch.tensor(float(step))
        optimizer.state[p] = state
    for group in optimizer.param_groups:
        group["lr"] = float(tensors["lr"])
    return step


def state_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, str]:
    """sha256 of every weight and every optimizer tensor (m, v, step, lr), as bytes: equal digests = equal state."""
    def digest(t: torch.Tensor) -> str:
        raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return f"{t.dtype}{tuple(t.shape)}:" + hashlib.sha256(raw).hexdigest()

    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    tensors.update({f"optimizer.{k}": v for k, v in optimizer_tensors(model, optimizer).items()})
    return {name: digest(t) for name, t in sorted(tensors.items())}


def save_checkpoint(run: Path, model, optimizer, train_state: TrainState, tokenizer_dir: Path | None) -> Path:
    """Write the slot CURRENT does not name, then point CURRENT at it. Returns the slot path."""
    run = Path(run)
    named = current_slot(run)
    target = run / (SLOTS[1] if named is not None and named.name == SLOTS[0] else SLOTS[0])
    if os.environ.get(STATE_DIGEST_ENV):  # the kill test's check [A]: the state as it was in memory
        _write_text(Path(os.environ[STATE_DIGEST_ENV]) / f"step-{train_state.step}.json",
                    json.dumps(state_digest(model, optimizer)))
    try:
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        model.save_pretrained(target, safe_serialization=True)
        _fsync_file(target / "model.safetensors")
        save_file(optimizer_tensors(model, optimizer), str(target / "optimizer.safetensors"))
        _fsync_file(target / "optimizer.safetensors")
        if tokenizer_dir is not None:
            for name in TOKENIZER_FILES:
                if (Path(tokenizer_dir) / name).exists():
                    shutil.copy2(Path(tokenizer_dir) / name, target / name)
        _write_text(target / "train_state.json", train_state.to_json())
        if os.environ.get(PAUSE_IN_SAVE_ENV):
            _write_text(run / "SAVING", str(train_state.step))
            time.sleep(float(os.environ[PAUSE_IN_SAVE_ENV]))
        _write_text(target / "COMPLETE", f"{time.time():.0f}\nstep={train_state.step}\n")
        _fsync_dir(target)
        _write_text(run / "CURRENT.tmp", target.name + "\n")
        os.replace(run / "CURRENT.tmp", run / "CURRENT")
        _fsync_dir(run)
    except OSError as err:
        shutil.rmtree(target, ignore_errors=True)  # never leave a half-written slot behind
        kept = f"the last good checkpoint ({named.name}) is untouched" if named else "no earlier checkpoint existed"
        raise CheckpointError(f"could not save a checkpoint in {run}: {err.strerror or err}; {kept}. "
                              "Free disk space or fix permissions, then resume with --resume auto") from err
    except BaseException:  # any other failure (or Ctrl-C) mid-save: no half-written slot either
        shutil.rmtree(target, ignore_errors=True)
        raise
    finally:
        (run / "SAVING").unlink(missing_ok=True)
    return target


def load_checkpoint(slot: Path, model, optimizer) -> tuple[TrainState, bool]:
    """Load weights (and optimizer state if present) into already-built objects; returns the train state and
    whether the optimizer state was there to restore."""
    state_dict = load_file(str(slot / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise CheckpointError(f"{slot}: weights do not fit the model (missing {missing}, unexpected {unexpected})")
    train_state = TrainState.read(slot)
    restored = (slot / "optimizer.safetensors").exists()
    if restored:
        load_optimizer_tensors(model, optimizer, load_file(str(slot / "optimizer.safetensors")))
    return train_state, restored


STRUCTURAL = ("model_config", "tokenizer_sha256", "data_index_sha256")  # never changeable on resume


class ResumeMismatch(CheckpointError):
    """The run's options differ from the checkpoint's; the message names each change."""


def check_resumable(train_state: TrainState, fingerprint: dict, allow: frozenset[str] | set[str] = frozenset()) -> dict:
    """Refuse to resume when anything that shapes the trajectory changed (docs/design.md §7): model config,
    tokenizer, data, and every training option in the fingerprint. Options named in `allow` may change (returned as
    {option: [old, new]} for the log); options an older checkpoint did not record are returned under "unrecorded"."""
    saved = train_state.fingerprint
    changes = {key: [saved[key], value] for key, value in fingerprint.items() if key in saved and saved[key] != value}
    refused = {k: v for k, v in changes.items() if k in STRUCTURAL or k not in allow}
    if refused:
        described = []
        for key, (old, new) in refused.items():
            if key == "model_config":
                fields = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
                described.append(f"model config ({', '.join(f'{f} {old.get(f)} -> {new.get(f)}' for f in fields)})")
            elif key in STRUCTURAL:
                described.append(f"{key.replace('_sha256', '')} (sha256 {str(old)[:12]} -> {str(new)[:12]})")
            else:
                described.append(f"{key} {old} -> {new}")
        allowable = [k for k in refused if k not in STRUCTURAL]
        raise ResumeMismatch(
            f"changed settings/tokenizer since the checkpoint: {'; '.join(described)}. Restore the original options, "
            "or start a new run (another --out, or --resume never to overwrite)"
            + (f", or accept the change deliberately with --allow-change {','.join(allowable)} (recorded in the log)"
               if allowable else "; the model config, tokenizer and data can never change within a run"))
    unrecorded = sorted(k for k in fingerprint if k not in saved)
    return {**changes, **({"unrecorded": unrecorded} if unrecorded else {})}


def export_final(run: Path, slot: Path, metrics: dict) -> Path:
    """Copy a slot's model + tokenizer (no optimizer) to RUN/final via a temp dir and rename; `metrics` (the facts
    of these weights) go into metrics.json and lineage.json."""
    final, tmp = run / "final", run / "final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for item in slot.iterdir():
        if item.name not in ("optimizer.safetensors", "COMPLETE", "train_state.json"):
            shutil.copy2(item, tmp / item.name)
    lineage = write_lineage(tmp, "pretrain", **metrics)
    _write_text(tmp / "metrics.json", json.dumps({**metrics, "weights_sha256": lineage["weights_sha256"]}, indent=2))
    old = run / "final.old"
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final
