"""A run folder's own files, written and read in one place: `hitoban pretrain`'s night and a federated server's run
write them through `RunFolder`, and `hitoban watch`, `hitoban plot`, `hitoban card` and the kill test read them
through it. The checkpoints (CURRENT, ckpt-A/, ckpt-B/) stay training/pretrain/checkpoint.py's; final/ is the
best (or last) model, a `from_pretrained` folder with its lineage.json.

  config.json      what the run was asked and what it decided: {"kind", "schema": 2, "run_id", "given": the options
                   as the command held them, "resolved": the values decided from them that the options do not hold
                   (precision used, compile, context, total steps, ...), "fingerprint": the trajectory a resume must
                   share, "hardware", "device_plan", ...}. Each value once: a resolved value equal to the given one is
                   not repeated (`setting` reads either); the fingerprint stores its identities (model, tokenizer,
                   data) and only names the settings it shares (`from_settings`); the device plan leaves out the
                   precision used. `run_config` reads them back whole. Schema 1 (until 2026-12: "args" + the same
                   values again at the top) still reads, as the same view.
  log.jsonl        append-only records, one JSON object a line, each with its "type" (train, eval, resume, round, ...)
  heartbeat.json   an atomic progress snapshot (`hitoban watch`); a federated run's says "kind": "federated-heartbeat"
  summary.json     the run's outcome, written when it stops

A near-leaf (hitoban.errors, hitoban.files, hitoban.provenance; standard library only): `hitoban watch` starts
without torch, and release/ (`hitoban card`) may read a run's config through it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hitoban.errors import InputError, MissingInputError
from hitoban.files import check_fields, read_json, read_jsonl
from hitoban.provenance import write_json

CONFIG, LOG, HEARTBEAT, SUMMARY, FINAL = "config.json", "log.jsonl", "heartbeat.json", "summary.json", "final"
CONFIG_SCHEMA, SUMMARY_SCHEMA = 2, 1
RUN_KINDS = ("pretrain-run", "federated-run")
FEDERATED_HEARTBEAT = "federated-heartbeat"
FROM_SETTINGS = "from_settings"  # config.json's fingerprint: the names whose values given/resolved hold

NUMBER = (int, float)
# what `hitoban watch` prints of a heartbeat, by kind; each checked for its type when the heartbeat is read
HEARTBEAT_FIELDS = {"step": int, "total_steps": int, "tokens_seen": int, "token_budget": int, "lr": NUMBER,
                    "tok_per_sec": NUMBER, "elapsed_hours": NUMBER, "resumes": int, "updated_at": NUMBER}
FEDERATED_FIELDS = {"round": int, "tokens_seen": int, "token_budget": int, "bytes_sent": NUMBER, "reissued": int,
                    "elapsed_hours": NUMBER, "resumes": int, "machines": dict, "updated_at": NUMBER}
OPTIONAL_NUMBERS = ("best_val", "train_loss", "eta_hours", "mfu", "peak_gb")

# schema 1's top-level keys that schema 2 holds elsewhere (resolved, or in the fingerprint)
_SCHEMA1_MOVED = ("kind", "schema", "args", "total_steps", "tokens_per_step", "compiled", "model",
                  "data_index_sha256", "tokenizer_sha256", "federated")


def run_config(data: dict, where: str = CONFIG) -> dict:
    """A run's config.json as schema 2's view, whichever schema wrote it: {"kind", "schema" (the file's),
    "run_id", "given", "resolved", "fingerprint", ...the other facts}. Schema 1 wrote the options as "args" and the
    decided values at the top level (a federated run's also under "federated"); they are read into "given" and
    "resolved" (a federated run's kind becomes "federated-run")."""
    check_fields(data, {}, where)
    if data.get("schema", 1) >= 2:
        return _whole(check_fields(data, {"kind": str, "given": dict, "resolved": dict}, where), where)
    args = data.get("args") or {}
    if not isinstance(args, dict):
        raise InputError(f"{where}: field 'args' is {repr(args)[:40]}, not an object; the file is damaged")
    fingerprint = data.get("fingerprint") or {"model_config": data.get("model"),
                                              "data_index_sha256": data.get("data_index_sha256"),
                                              "tokenizer_sha256": data.get("tokenizer_sha256")}
    plan = data.get("device_plan") or {}
    decided = {"context": fingerprint.get("context"), "precision": plan.get("precision_used",
                                                                             fingerprint.get("precision")),
               "compile": data.get("compiled"), "total_steps": data.get("total_steps"),
               "tokens_per_step": data.get("tokens_per_step")}
    resolved = {k: v for k, v in decided.items() if v is not None and args.get(k) != v}
    kind = "federated-run" if data.get("federated") else data.get("kind", "pretrain-run")
    return {"kind": kind, "schema": data.get("schema", 1), "run_id": data.get("run_id"), "given": args,
            "resolved": resolved, "fingerprint": fingerprint,
            **{k: v for k, v in data.items() if k not in _SCHEMA1_MOVED and k not in ("run_id", "fingerprint")}}


def _whole(config: dict, where: str) -> dict:
    """Schema 2 as written (`write_config`) with the fingerprint and device plan whole again: the settings they
    share with given/resolved, stored there once, filled back in by name."""
    view = dict(config)
    fingerprint = view.get("fingerprint")
    if isinstance(fingerprint, dict) and FROM_SETTINGS in fingerprint:
        names = fingerprint[FROM_SETTINGS]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise InputError(f"{where}: fingerprint field {FROM_SETTINGS!r} is not a list of names; the file is "
                             f"damaged")
        view["fingerprint"] = {**{k: v for k, v in fingerprint.items() if k != FROM_SETTINGS},
                               **{n: setting(config, n) for n in names}}
    plan = view.get("device_plan")
    used = setting(config, "precision")
    if isinstance(plan, dict) and used is not None:
        auto = config.get("given", {}).get("precision") == "auto"
        view["device_plan"] = {**({"precision": used} if auto else {}), **plan, "precision_used": used}
    return view


def setting(config: dict, name: str, default=None):
    """One value of a run's config view (`run_config`): what it resolved to, else what was given."""
    if name in config.get("resolved", {}):
        return config["resolved"][name]
    return config.get("given", {}).get(name, default)


def check_heartbeat(hb: dict, where: str) -> dict:
    """`hb` with every field `hitoban watch` prints of its type (pretraining's fields, or a federated run's)."""
    check_fields(hb, FEDERATED_FIELDS if hb.get("kind") == FEDERATED_HEARTBEAT else HEARTBEAT_FIELDS, where)
    for name in OPTIONAL_NUMBERS:
        if hb.get(name) is not None:
            check_fields(hb, {name: NUMBER}, where)
    return hb


class RunFolder:
    """The files of one run folder (see the module's docstring): writers for the run, checked readers for
    everything that reads it afterwards or meanwhile."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._tail_checked = False  # log.jsonl's last line looked at once, before this writer's first append

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG

    @property
    def log_path(self) -> Path:
        return self.path / LOG

    @property
    def heartbeat_path(self) -> Path:
        return self.path / HEARTBEAT

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY

    @property
    def final(self) -> Path:
        return self.path / FINAL

    # ------------------------------------------------------------------------------------------------ writing
    def write_config(self, kind: str, given: dict, resolved: dict, fingerprint: dict | None = None,
                     device_plan: dict | None = None, **facts) -> Path:
        """config.json (atomic), each value once: the options as given; the values decided from them (one equal to
        its given value is left out); the fingerprint's identities (model, tokenizer, data) with, by name only, the
        settings it shares with given/resolved; the device plan without the precision used (resolved holds it).
        `run_config` reads the whole fingerprint and plan back."""
        if kind not in RUN_KINDS:
            raise ValueError(f"config.json: kind {kind!r} is not one of {RUN_KINDS}")
        clash = sorted(set(facts) & {"kind", "schema", "given", "resolved"})
        if clash:
            raise ValueError(f"config.json: facts {clash} would overwrite the config's own fields")
        resolved = {k: v for k, v in resolved.items() if k not in given or given[k] != v}
        view = {"given": given, "resolved": resolved}
        if fingerprint is not None:
            shared = sorted(k for k, v in fingerprint.items() if k in given or k in resolved
                            if setting(view, k) == v)
            facts["fingerprint"] = {**{k: v for k, v in fingerprint.items() if k not in shared},
                                    FROM_SETTINGS: shared}
        if device_plan is not None:
            used, asked = setting(view, "precision"), given.get("precision")
            facts["device_plan"] = {k: v for k, v in device_plan.items()  # with `auto` the plan's is the one used
                                    if not (k == "precision_used" and used == v)
                                    and not (k == "precision" and asked == "auto" and used == v)}
        return write_json(self.config_path, {"kind": kind, "schema": CONFIG_SCHEMA, **view, **facts})

    def log(self, record: dict) -> None:
        """Append one record to log.jsonl, flushed: a crash loses at most the line being written, which readers
        leave out (`records`). A resumed run's first append first drops such a half-written last line, so that the
        records after it read."""
        path = self.log_path
        if path.exists() and not path.is_file():  # a folder or FIFO there would block or crash mid-night
            raise InputError(f"{path}: not a regular file; move it away and resume")
        self.path.mkdir(parents=True, exist_ok=True)
        if not self._tail_checked:
            self._drop_torn_line(path)
            self._tail_checked = True
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            f.flush()

    @staticmethod
    def _drop_torn_line(path: Path) -> None:
        """Cut a last line the writer never finished (no newline after it: a crash mid-write) off log.jsonl."""
        if not path.is_file() or path.stat().st_size == 0:
            return
        with open(path, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return
            f.seek(0)
            data = f.read()
            f.truncate(data.rfind(b"\n") + 1)

    def heartbeat(self, data: dict) -> Path:
        """heartbeat.json, whole or not at all (provenance.write_json)."""
        return write_json(self.heartbeat_path, data)

    def write_summary(self, kind: str, data: dict) -> Path:
        """summary.json (atomic): {"kind", "schema", **data}."""
        return write_json(self.summary_path, {"kind": kind, "schema": data.get("schema", SUMMARY_SCHEMA),
                                              **{k: v for k, v in data.items() if k not in ("kind", "schema")}})

    # ------------------------------------------------------------------------------------------------ reading
    def config(self) -> dict:
        """config.json as schema 2's view (`run_config`), from either schema; refused in one line when damaged."""
        data = read_json(self.config_path, f"{self.path}: run config", made_by="hitoban pretrain")
        return run_config(data, f"{self.path}: {CONFIG}")

    def log_records(self) -> tuple[list[dict], str | None]:
        """(every whole record of log.jsonl, a note when its last line is half-written and was left out)."""
        path = self.log_path
        if not path.exists() and not path.is_symlink():
            raise MissingInputError(f"{path}: no training log (is this a `hitoban pretrain` run folder?)")
        return read_jsonl(path, f"{self.path}", fields={"type": str})

    def records(self, type: str | None = None) -> list[dict]:  # noqa: A002 - the records' own field name
        """log.jsonl's whole records, or those of one `type`."""
        records, _ = self.log_records()
        return records if type is None else [r for r in records if r["type"] == type]

    def heartbeat_now(self) -> dict | None:
        """heartbeat.json with the fields `hitoban watch` prints checked, or None before the run has written one."""
        path = self.heartbeat_path
        if not path.exists() and not path.is_symlink():
            return None
        return check_heartbeat(read_json(path, f"{self.path}", fields={}), f"{self.path}: {HEARTBEAT}")

    def summary(self) -> dict | None:
        """summary.json, or None while the run has not stopped; refused in one line when damaged."""
        path = self.summary_path
        if not path.exists() and not path.is_symlink():
            return None
        return read_json(path, f"{self.path}: run summary")
