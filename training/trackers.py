"""`--report-to`: the night's numbers in the experiment tracker a user already watches, through Accelerate's trackers.

log.jsonl stays the run's record; a tracker receives the same numbers at the same steps (the monitor hands each
train and eval record to `RunTrackers.log`), named `train/loss`, `eval/val_loss`, `eval/val_domains/literature`, ...
Nothing is sent anywhere unless a tracker is asked for, and a tracker whose package is missing is an error before
anything starts (Accelerate itself would drop it with a debug message and log to nothing). A resume continues the
same tracker run rather than starting another: TensorBoard writes to RUN/tensorboard (events from the steps after the
checkpoint, logged before the crash, are purged), trackio and W&B name the run by its run id (kept across resumes),
MLflow's run id is kept in RUN/trackers.json. The Trainer verbs (`sft`, `tone`) pass the same choice as `report_to`.
Lazy imports: Accelerate's trackers load only when `--report-to` names one."""

from __future__ import annotations

import json
from pathlib import Path

from hitoban.errors import UsageError
from hitoban.provenance import write_json

PROJECT = "hitoban"  # the project (W&B, trackio, MLflow experiment) every hitoban run reports to
TRACKERS = ("tensorboard", "trackio", "wandb", "mlflow", "aim", "comet_ml", "clearml", "dvclive", "swanlab")
# hitoban[...] extras (the others: pip install NAME); also the trackers whose run a resume continues (RunTrackers)
EXTRAS = ("tensorboard", "trackio", "wandb", "mlflow")
# Config stored once, on the run's first session: TensorBoard adds a run per hparams call, MLflow refuses to change a
# logged param (a resume with --allow-change would stop there); the change itself is in log.jsonl's "change" record
CONFIG_ONCE = ("tensorboard", "mlflow")
REPORT_TO_HELP = ("experiment trackers for the same numbers as log.jsonl, comma-separated: none, "
                  + ", ".join(TRACKERS) + " (through Accelerate's trackers; nothing is sent anywhere with none)")
STATE = "trackers.json"


def parse_report_to(text: str | None) -> list[str]:
    """`--report-to` as a list of tracker names ([] for none), or a UsageError naming what is unknown."""
    names = list(dict.fromkeys(n.strip().lower() for n in (text or "none").split(",") if n.strip()))
    if names in ([], ["none"]):
        return []
    unknown = [n for n in names if n not in TRACKERS]
    if unknown or "none" in names:
        raise UsageError(f"--report-to {text}: unknown tracker(s) {unknown or ['none (with others)']}; choose none "
                         f"or a comma-separated list of {', '.join(TRACKERS)}")
    return names


def install_hint(name: str) -> str:
    return f"pip install 'hitoban[{name}]'" if name in EXTRAS else f"pip install {name}"


def check_available(names: list[str]) -> None:
    """Every asked-for tracker importable (by Accelerate's own test), else a UsageError naming what to install."""
    if not names:
        return
    from accelerate.tracking import get_available_trackers

    available = {str(t) for t in get_available_trackers()}
    missing = [n for n in names if n not in available]
    if missing:
        raise UsageError(f"--report-to {','.join(names)}: the package for {', '.join(missing)} is not installed: "
                         + "; ".join(install_hint(n) for n in missing) + " (or drop it from --report-to)")


def scalars(record: dict) -> dict[str, float]:
    """A log.jsonl train/eval record as tracker scalars: every number in it but the step, under `TYPE/` (nested
    dicts joined with '/'); {} for the other records (device, resume, skip)."""
    if record.get("type") not in ("train", "eval"):
        return {}
    out: dict[str, float] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}/{key}", inner)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[prefix] = value

    for key, value in record.items():
        if key not in ("type", "step"):
            walk(f"{record['type']}/{key}", value)
    return out


def flat_config(values: dict) -> dict:
    """Options as a tracker's config: scalars, strings and None as they are, anything else as JSON text
    (TensorBoard's hparams refuse lists)."""
    return {k: v if v is None or isinstance(v, bool | int | float | str) else json.dumps(v, ensure_ascii=False)
            for k, v in values.items()}


class RunTrackers:
    """The trackers of one run folder, on the main process: Accelerate's tracker classes, started with the run's
    options as their config, fed the monitor's records, finished at the end. Held here rather than by the
    Accelerator because which tracker run to continue is known only after the resume, when the Accelerator exists."""

    def __init__(self, names: list[str], run: Path, run_name: str, run_id: str, resume_step: int | None):
        from accelerate.tracking import (
            LOGGER_TYPE_TO_CLASS,
            MLflowTracker,
            TensorBoardTracker,
            TrackioTracker,
            WandBTracker,
        )

        self.names, self.run, self.resumed = names, Path(run), resume_step is not None
        path = self.run / STATE
        saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        display = f"{run_name}-{run_id[:8]}"  # one tracker run per hitoban run id, which every resume keeps
        made = {
            # logging_dir/run_name = RUN/tensorboard; purge_step hides what a crashed session logged past the
            # checkpoint, so the resumed curve is not drawn twice
            "tensorboard": lambda: TensorBoardTracker("tensorboard", str(self.run),
                                                      **({"purge_step": resume_step + 1} if self.resumed else {})),
            "trackio": lambda: TrackioTracker(PROJECT, name=display, resume="allow"),
            "wandb": lambda: WandBTracker(PROJECT, name=display, id=run_id, resume="allow", dir=str(self.run)),
            "mlflow": lambda: MLflowTracker(PROJECT, run_id=saved.get("mlflow_run_id"), run_name=display),
        }
        self.trackers = []
        for name in names:
            if name in made:
                self.trackers.append(made[name]())
            else:
                cls = LOGGER_TYPE_TO_CLASS[name]
                self.trackers.append(cls(PROJECT, str(self.run)) if cls.requires_logging_directory else cls(PROJECT))

    def start(self, config: dict) -> None:
        """Start every tracker with `config` (TensorBoard's and MLflow's only on the run's first session:
        CONFIG_ONCE). MLflow's run id is kept for the next resume."""
        values, record = flat_config(config), {"report_to": self.names}
        for tracker in self.trackers:
            tracker.start()
            if not (self.resumed and tracker.name in CONFIG_ONCE):
                tracker.store_init_configuration(values)
            if tracker.name == "mlflow":
                record["mlflow_run_id"] = tracker.tracker.info.run_id
        write_json(self.run / STATE, record)
        later = [n for n in self.names if n not in EXTRAS]
        if later and self.resumed:
            print(f"# --report-to: this resume starts a new run in {', '.join(later)}", flush=True)

    def log(self, record: dict) -> None:
        values = scalars(record)
        if values:
            for tracker in self.trackers:
                tracker.log(values, step=record["step"])

    def finish(self) -> None:
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []
