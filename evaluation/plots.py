"""`hitoban plot RUN`: loss curves from a run's log.jsonl (train, val, per-domain val, resumes) and the kill test."""

from __future__ import annotations

import json
from pathlib import Path

from hitoban.errors import InputError, MissingInputError


def read_log(run: str | Path) -> dict:
    path = Path(run) / "log.jsonl"
    if not path.exists():
        raise MissingInputError(f"{path}: no training log (is this a `hitoban pretrain` run folder?)")
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {"train": [r for r in records if r["type"] == "train"], "eval": [r for r in records if r["type"] == "eval"],
            "resume": [r for r in records if r["type"] == "resume"]}


def plot_run(run: str | Path, out: str | Path | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hitoban.evaluation.fonts import use_japanese_font

    use_japanese_font()
    run = Path(run)
    log = read_log(run)
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
        from hitoban.training.killtest import plot_killtest

        plot_killtest(json.loads(killtest.read_text()), out / "killtest.png")
        paths.append(out / "killtest.png")
    return paths
