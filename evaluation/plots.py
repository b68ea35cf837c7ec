"""Figures drawn from what runs wrote: loss curves from a run's log.jsonl (train, val, per-domain val, resumes,
`hitoban plot RUN`) and the kill test's panels from its killtest.json.
Lazy imports: matplotlib loads only when a figure is drawn (the Agg backend first), so reading a log does not pay
for it."""

from __future__ import annotations

from pathlib import Path

from hitoban.errors import InputError
from hitoban.files import check_fields, read_json
from hitoban.run_folder import RunFolder

RECORD_FIELDS = {"train": {"step": int, "loss": (int, float)}, "eval": {"step": int, "val_loss": (int, float)},
                 "resume": {"step": int}}


def read_log(run: str | Path) -> dict:
    """A run's log.jsonl by kind of record, read as far as it is whole (`note` says where a half-written last line
    was left out); a record lacking what a figure plots is refused with its line."""
    folder = RunFolder(run)
    records, note = folder.log_records()
    for number, record in enumerate(records, 1):
        check_fields(record, RECORD_FIELDS.get(record["type"], {}), f"{folder.log_path.name} record {number}")
    return {"train": [r for r in records if r["type"] == "train"], "eval": [r for r in records if r["type"] == "eval"],
            "resume": [r for r in records if r["type"] == "resume"], "note": note}


def plot_run(run: str | Path, out: str | Path | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hitoban.evaluation.fonts import use_japanese_font

    use_japanese_font()
    run = Path(run)
    log = read_log(run)
    if log["note"]:
        print(f"note: {log['note']}", flush=True)
    if not log["train"]:
        raise InputError(f"{run}/log.jsonl has no train records yet")
    out = Path(out or run / "plots")
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.plot([r["step"] for r in log["train"]], [r["loss"] for r in log["train"]], label="train", color="#4c72b0")
    if log["eval"]:
        ax.plot([r["step"] for r in log["eval"]], [r["val_loss"] for r in log["eval"]], "o-", label="val",
                color="#dd8452")
        domains = sorted({d for r in log["eval"] for d in r.get("val_domains", {})})
        for domain in domains if len(domains) > 1 else []:
            points = [(r["step"], r["val_domains"][domain]) for r in log["eval"] if domain in r.get("val_domains", {})]
            ax.plot(*zip(*points), "x--", label=f"val: {domain}", linewidth=1)
    for r in log["resume"]:
        ax.axvline(r["step"], color="#999", linestyle=":", linewidth=1)
    if log["resume"]:
        ax.plot([], [], ":", color="#999", label="resumed")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(f"{run.name}: pretraining loss")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths = [out / "loss.png"]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)
    killtest = run / "killtest.json"
    if killtest.exists():
        plot_killtest(read_json(killtest, f"{run}"), out / "killtest.png")
        paths.append(out / "killtest.png")
    return paths


def plot_killtest(result: dict, path: Path) -> None:
    """Two panels: weight differences (noise / killed / control) and loss-curve steps; numbers from the result."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    labels = ["noise floor", "killed + resumed", "control (no optimizer)"]
    diffs = [result["noise"], result["killed_diff"], result["control_diff"]]
    floor = min([d for d in diffs if d > 0], default=1e-8) / 10
    left.bar(labels, [max(d, floor) for d in diffs], color=["#888", "#2a7", "#c44"])
    left.set_yscale("log")
    left.set_title("max |weight difference| vs uninterrupted run")
    for i, d in enumerate(diffs):
        left.text(i, max(d, floor), "0 (bit-exact)" if d == 0 else f"{d:.2e}", ha="center", va="bottom", fontsize=8)
    gaps = [result["loss_step"], result["control_loss_gap"]]
    right.bar(["killed + resumed", "control"], gaps, color=["#2a7", "#c44"])
    right.set_title("max train-loss step")
    for i, g in enumerate(gaps):
        right.text(i, g, f"{g:.2e}", ha="center", va="bottom", fontsize=8)
    fig.suptitle(f"kill test: {'PASSED' if result['passed'] else 'FAILED'} ({result['mode']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
