"""Crash-safe A/B checkpoints (docs/design.md §7).

RUN/CURRENT names the last good slot (`ckpt-A` or `ckpt-B`). A save always writes the *other* slot: model, optimizer
(step, m, v per parameter, in safetensors), config, tokenizer, train_state.json, then COMPLETE, each fsync'd, and
only then swaps CURRENT (temp file + fsync + os.replace + directory fsync). A crash or a full disk at any point
leaves CURRENT naming an intact slot. A slot without COMPLETE is never loaded: correctness is structural.
COMPLETE records the size and sha256 of every other file in the slot (and a checksum of itself): a resume verifies
them first, so a slot damaged after its save (a zeroed block, a truncated or deleted file) is never loaded silently;
the other slot is resumed instead, with one line naming the damaged file, and with neither intact the resume refuses.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from hitoban.errors import CheckpointError, HitobanError  # noqa: F401 - CheckpointError: importable from here
from hitoban.files import TOKENIZER_FILES
from hitoban.provenance import replacing, write_lineage
from hitoban.training import faults
from hitoban.training.optim import load_optimizer_tensors, optimizer_tensors  # noqa: F401 - a slot's optimizer.safetensors

SLOTS = ("ckpt-A", "ckpt-B")
# The kill test's hooks (training/faults.py): pause_in_save (a SIGKILL lands inside a save, after the weights and
# before COMPLETE) and state_digest_dir (a digest of the *in-memory* state just before each save, for check [A]).


class SlotDamaged(CheckpointError):
    """One slot's file differs from what its COMPLETE marker recorded at the save (`file` names it)."""

    def __init__(self, slot: Path, file: str, problem: str):
        super().__init__(f"{Path(slot).name}/{file}: {problem}")
        self.slot, self.file, self.problem = Path(slot), file, problem


class CheckpointDamaged(CheckpointError):
    """No slot of the run is intact: nothing can be resumed; the message says which files and what to do."""


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
    skipped_steps: int = 0  # fp16: updates the gradient scaler skipped (counted in `step`, not applied)
    extra: dict = field(default_factory=dict)  # a loop's own state beyond steps (the federated server's task queue)
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


MARKER = "COMPLETE"
MARKER_SCHEMA = 2  # 1: "<time>\nstep=<n>\n", no checksums (hitoban before issue 35)
OLD_MARKER = re.compile(r"\d+\nstep=\d+\n?")


def file_sha256(path: Path, fsync: bool = False) -> str:
    """sha256 of a file's bytes; `fsync`: also make sure they are on the disk (the save's tokenizer copies and
    config.json are not fsync'd where they are written)."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        if fsync:
            os.fsync(f.fileno())
    return digest


def _manifest_sha256(manifest: dict) -> str:
    """The marker's checksum of itself: a flipped byte in COMPLETE is named as COMPLETE, not as the file whose
    recorded digest it happened to hit."""
    body = {k: v for k, v in manifest.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def slot_files(slot: Path) -> list[str]:
    """Every file of a slot but its marker, as paths relative to the slot."""
    return sorted(p.relative_to(slot).as_posix() for p in slot.rglob("*") if p.is_file() and p.name != MARKER)


def seal(slot: Path, step: int) -> None:
    """Write COMPLETE: the step and the size and sha256 of every file now in the slot, each fsync'd. Hashing re-reads
    what the save just wrote, from the page cache, a small share of the save (measured in docs/design.md §7), so it
    is not worth doing while writing."""
    files = {name: {"bytes": (slot / name).stat().st_size, "sha256": file_sha256(slot / name, fsync=True)}
             for name in slot_files(slot)}
    manifest = {"schema": MARKER_SCHEMA, "step": step, "completed": round(time.time()), "files": files}
    manifest["sha256"] = _manifest_sha256(manifest)
    _write_text(slot / MARKER, json.dumps(manifest, indent=1))


def recorded_files(slot: Path) -> dict | None:
    """The files COMPLETE recorded ({name: {bytes, sha256}}); None for an older hitoban's marker, which recorded
    none. A marker that is neither, or whose own checksum fails, is a SlotDamaged naming COMPLETE."""
    raw = (slot / MARKER).read_bytes()
    try:
        text = raw.decode("utf-8")
        if OLD_MARKER.fullmatch(text):
            return None
        manifest = json.loads(text)
        files = manifest["files"]
        if manifest.get("sha256") != _manifest_sha256(manifest) or not isinstance(files, dict):
            raise ValueError("its own checksum does not match")
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise SlotDamaged(slot, MARKER, f"unreadable or altered since the save ({err})") from None
    return files


def file_problem(path: Path, recorded: dict) -> str | None:
    """What is wrong with one file against its record, or None when it is as saved."""
    if not path.is_file():
        return "missing (it was written and recorded at the save)"
    size = path.stat().st_size
    if size != recorded["bytes"]:
        return f"{size:,} bytes, {recorded['bytes']:,} were saved"
    if file_sha256(path) != recorded["sha256"]:
        return "its sha256 differs from the one recorded at the save (same size: overwritten or corrupted)"
    return None


def verify_slot(slot: Path) -> bool:
    """Check every file of `slot` against its COMPLETE marker: raises SlotDamaged naming the first that differs;
    returns False for a slot an older hitoban wrote without checksums (nothing to verify), True when verified."""
    recorded = recorded_files(slot)
    if recorded is None:
        return False
    for name, record in recorded.items():
        if (problem := file_problem(slot / name, record)) is not None:
            raise SlotDamaged(slot, name, problem)
    return True


def drop_optimizer_state(slot: Path) -> None:
    """Remove a slot's optimizer state on purpose and re-seal the slot: the kill test's control resumes from such a
    slot (moments from zero) to show that its comparison sees the difference. Deleting the file by hand is damage."""
    (Path(slot) / "optimizer.safetensors").unlink()
    seal(Path(slot), TrainState.read(slot).step)


def named_slot(run: Path) -> str | None:
    """The name CURRENT holds (None without CURRENT); a damaged CURRENT reads as a name no slot has."""
    path = Path(run) / "CURRENT"
    return path.read_text(encoding="utf-8", errors="replace").strip() if path.exists() else None


def current_slot(run: Path) -> Path | None:
    """The slot to resume from: CURRENT's if complete, else the other complete one, else None."""
    named = named_slot(run)
    order = [named] if named in SLOTS else []
    order += [s for s in SLOTS if s not in order]
    for name in order:
        slot = run / name
        if (slot / "COMPLETE").exists() and (slot / "model.safetensors").exists():
            return slot
    return None


def state_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler=None) -> dict[str, str]:
    """sha256 of every weight and every optimizer tensor (m, v, step, lr, the fp16 scaler's state), as bytes: equal
    digests = equal state."""
    def digest(t: torch.Tensor) -> str:
        raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return f"{t.dtype}{tuple(t.shape)}:" + hashlib.sha256(raw).hexdigest()

    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    tensors.update({f"optimizer.{k}": v for k, v in optimizer_tensors(model, optimizer, scaler).items()})
    return {name: digest(t) for name, t in sorted(tensors.items())}


def save_checkpoint(run: Path, model, optimizer, train_state: TrainState, tokenizer_dir: Path | None,
                    scaler=None) -> Path:
    """Write the slot CURRENT does not name, then point CURRENT at it (`scaler`: fp16's GradScaler, whose state
    goes with the optimizer's). Returns the slot path."""
    run = Path(run)
    named = current_slot(run)
    target = run / (SLOTS[1] if named is not None and named.name == SLOTS[0] else SLOTS[0])
    hooks = faults.active()
    if hooks.state_digest_dir:  # the kill test's check [A]: the state as it was in memory
        _write_text(Path(hooks.state_digest_dir) / f"step-{train_state.step}.json",
                    json.dumps(state_digest(model, optimizer, scaler)))
    try:
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        model.save_pretrained(target, safe_serialization=True)
        _fsync_file(target / "model.safetensors")
        save_file(optimizer_tensors(model, optimizer, scaler), str(target / "optimizer.safetensors"))
        _fsync_file(target / "optimizer.safetensors")
        if tokenizer_dir is not None:
            for name in TOKENIZER_FILES:
                if (Path(tokenizer_dir) / name).exists():
                    shutil.copy2(Path(tokenizer_dir) / name, target / name)
        _write_text(target / "train_state.json", train_state.to_json())
        if hooks.pause_in_save:
            _write_text(run / "SAVING", str(train_state.step))
            time.sleep(hooks.pause_in_save)
        seal(target, train_state.step)
        _fsync_dir(target)
        point_current(run, target)
    except (OSError, SafetensorError) as err:
        shutil.rmtree(target, ignore_errors=True)  # never leave a half-written slot behind
        kept = f"the last good checkpoint ({named.name}) is untouched" if named else "no earlier checkpoint existed"
        if getattr(err, "errno", None) == errno.ENOSPC or "No space left" in str(err) or "os error 28" in str(err):
            need = sum(f.stat().st_size for f in named.iterdir()) if named else 0
            raise CheckpointError(f"could not save a checkpoint in {run}: No space left on device; {kept}. The disk is "
                                  f"full: a checkpoint takes about {need / 2**20:,.0f} MiB, free at least that much "
                                  f"on the disk holding {run}, then resume with --resume auto") from err
        raise CheckpointError(f"could not save a checkpoint in {run}: {getattr(err, 'strerror', None) or err}; "
                              f"{kept}. Free disk space or fix permissions, then resume with --resume auto") from err
    except BaseException:  # any other failure (or Ctrl-C) mid-save: no half-written slot either
        shutil.rmtree(target, ignore_errors=True)
        raise
    finally:
        (run / "SAVING").unlink(missing_ok=True)
    return target


def load_checkpoint(slot: Path, model, optimizer, scaler=None) -> tuple[TrainState, bool]:
    """Load weights (and optimizer state if present) into already-built objects; returns the train state and
    whether the optimizer state was there to restore."""
    state_dict = load_file(str(slot / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise CheckpointError(f"{slot}: weights do not fit the model (missing {missing}, unexpected {unexpected})")
    train_state = TrainState.read(slot)
    restored = (slot / "optimizer.safetensors").exists()
    if restored:
        load_optimizer_tensors(model, optimizer, load_file(str(slot / "optimizer.safetensors")), scaler)
    return train_state, restored


DAMAGE = (SlotDamaged, SafetensorError, OSError, ValueError)  # ValueError: an older slot's train_state.json cut short


def has_checkpoint(run: Path) -> bool:
    """Whether a resume has anything to resume, or to refuse: a complete slot, or CURRENT naming one that was."""
    return current_slot(run) is not None or (Path(run) / "CURRENT").exists()


def point_current(run: Path, slot: Path) -> None:
    """Make CURRENT name `slot`, atomically (temp file + fsync + os.replace + directory fsync)."""
    with replacing(run / "CURRENT") as tmp:
        _write_text(tmp, slot.name + "\n")
    _fsync_dir(run)


def _resume_order(run: Path) -> tuple[list[str], str | None]:
    """The slots to try, CURRENT's first, and the name CURRENT holds (None without one)."""
    named = named_slot(run)
    return ([named] if named in SLOTS else []) + [s for s in SLOTS if s != named], named


def _load_slot(slot: Path, model, optimizer, check, scaler, log) -> tuple[Path, TrainState, bool, dict]:
    """Verify `slot` against its marker, then check its train state and load it."""
    if not verify_slot(slot):
        log(f"note: {slot.name} was written by an older hitoban without checksums; it is loaded unverified")
    changes = check(TrainState.read(slot))
    state, restored = load_checkpoint(slot, model, optimizer, scaler)
    return slot, state, restored, changes


def load_latest(run: Path, model, optimizer, check=lambda state: {}, log=print, scaler=None, repoint: bool = True
                ) -> tuple[Path, TrainState, bool, dict]:
    """Load the newest intact slot, after `check(its train state)` (which refuses a changed trajectory and returns
    the allowed changes). A slot whose files differ from its marker's checksums (or that fails to load) is skipped
    with one line naming the damaged file, and the previous slot is resumed; `repoint` then points CURRENT at it, so
    the next save overwrites the damaged slot rather than the intact one. With no intact slot: CheckpointDamaged.
    Returns (slot, train state, optimizer state restored?, changes)."""
    run = Path(run)
    order, named = _resume_order(run)
    damaged: list[tuple[str, str]] = []  # (slot, what is wrong with it)
    for name in order:
        if not (run / name / MARKER).exists():
            if name == named:  # CURRENT is written only after COMPLETE: this marker was there and is gone
                damaged.append((name, f"{MARKER}: missing, though CURRENT names this slot"))
            continue
        try:
            loaded = _load_slot(run / name, model, optimizer, check, scaler, log)
        except DAMAGE as err:
            damaged.append((name, f"{err.file}: {err.problem}" if isinstance(err, SlotDamaged) else str(err)))
            continue
        for slot, problem in damaged:
            log(f"warning: {slot} is damaged ({problem}); resuming from {name}, the checkpoint before it")
        if repoint and name != named:
            point_current(run, run / name)
        return loaded
    described = "; ".join(f"{slot} is damaged ({problem})" for slot, problem in damaged) or "no slot is complete"
    raise CheckpointDamaged(f"{described}: no other complete checkpoint to resume in {run}; start over with "
                            "--resume never (the damaged run is set aside in previous-run/)")


PREVIOUS_RUN = "previous-run"  # --resume never: the replaced run, kept until the new one has saved
RUN_FILES = ("CURRENT", "ckpt-A", "ckpt-B", "final", "log.jsonl", "heartbeat.json", "summary.json", "config.json")


def _remove(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()


def set_aside(run: Path) -> list[str]:
    """--resume never: move the earlier run's files into RUN/previous-run (renames: nothing is copied or lost) so a
    later --resume auto can never mistake them for this run's. If a previous `never` run stopped before its first
    save, the run set aside then is still the one to keep: only that attempt's leftovers are removed."""
    run, previous = Path(run), Path(run) / PREVIOUS_RUN
    present = [name for name in RUN_FILES if (run / name).exists()]
    if previous.exists() and not (run / "CURRENT").exists():
        for name in present:
            _remove(run / name)
        return []
    if not present:
        return []
    shutil.rmtree(previous, ignore_errors=True)
    previous.mkdir()
    for name in present:
        os.replace(run / name, previous / name)
    _fsync_dir(run)
    return present


def restore_set_aside(run: Path) -> bool:
    """A `--resume never` run stopped before its first save leaves only RUN/previous-run: put it back, so that
    the folder's last complete checkpoint is the one resumed. True if it did."""
    run, previous = Path(run), Path(run) / PREVIOUS_RUN
    if not previous.is_dir() or (run / "CURRENT").exists():
        return False
    for item in previous.iterdir():
        if (run / item.name).exists():
            _remove(run / item.name)
        os.replace(item, run / item.name)
    previous.rmdir()
    return True


def drop_set_aside(run: Path) -> bool:
    """After this run's first complete checkpoint the replaced run is no longer needed."""
    previous = Path(run) / PREVIOUS_RUN
    if previous.exists():
        shutil.rmtree(previous)
        return True
    return False


class RunBusy(CheckpointError):
    """Another process is training in this run folder."""


class RunLock:
    """One process trains in a run folder at a time: two nights in one folder overwrite each other's slots. An
    advisory lock (flock) on RUN/LOCK, which the kernel releases when its process dies, so a killed run never
    blocks its own resume; the file names the holder's pid. (No lock where fcntl does not exist: Windows.)"""

    def __init__(self, run: Path):
        self.path, self.fd = Path(run) / "LOCK", None

    def acquire(self) -> RunLock:
        try:
            import fcntl
        except ImportError:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunBusy(f"{self.path.parent} is in use: another hitoban pretrain (pid {holder}) is training there; "
                          "wait for it, or stop it (Ctrl-C saves at the next step) and resume") from None
        except OSError as err:  # a file system without locks (some network mounts): train, but say so
            os.close(fd)
            print(f"warning: {self.path.parent} cannot be locked ({err.strerror}); make sure no other process "
                  "trains in this folder", flush=True)
            return self
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None


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
