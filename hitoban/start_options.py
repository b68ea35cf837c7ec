"""The options of the two verbs to start with, defined once (hitoban/options.py's mechanism): `hitoban doctor` and
`hitoban demo`. Standard library only at import (`hitoban --help` builds every verb's options)."""

from __future__ import annotations

from dataclasses import dataclass

from hitoban.options import Checked, option

DEVICE_CHECK_STEPS = 40  # the device check's kill test: a kill and a resume inside a short run
INSTALL_CHECK_STEPS = 200  # --cpu: enough for the tiny model's loss to fall clearly
DEMO_STAGES = ("corpus", "tokenizer", "shards", "calibrate", "pretrain", "sft", "eval", "leaks", "pii", "card",
               "upload", "load")  # the demo's stages in order (hitoban/demo.py runs a method of each name)


@dataclass(kw_only=True)
class DoctorOptions(Checked):
    """`hitoban doctor`: the device check before the night (or, with --cpu, the quick install check)."""

    out: str = option("hitoban-doctor", "folder for everything the check makes and doctor.json")
    cpu: bool = option(False, "the quick install check on the CPU instead (tokenizer, a tiny model trained --steps "
                              "steps, generation, save and reload)")
    steps: int | None = option(None, f"training steps (default: {DEVICE_CHECK_STEPS} for the device check's kill "
                                     f"test, {INSTALL_CHECK_STEPS} for --cpu)", min=1)
    seed: int = option(0, "seed for the tiny model and its batches", min=0)
    plant_fault: str | None = option(None, "prove the check can fail: the kill test's resume drops the optimizer "
                                           "state (must FAIL; the checks after the kill test are not run)",
                                     choices=("drop-optimizer-state",))

    def training_steps(self) -> int:
        return self.steps or (INSTALL_CHECK_STEPS if self.cpu else DEVICE_CHECK_STEPS)


@dataclass(kw_only=True)
class DemoOptions(Checked):
    """`hitoban demo`: the whole night in minutes."""

    out: str = option("hitoban-demo", "new folder for everything the demo makes (+ report.md)")
    source: list[str] = option(help="pretraining text: the built-in Japanese text (offline, default), a pinned slice "
                                    "of Aozora Bunko or FineWeb-2 (network), or your own files",
                               factory=lambda: ["builtin"], nargs="+", metavar="builtin|aozora|fineweb2-ja|PATH")
    quick: bool = option(False, "fewer steps everywhere (CI); every stage still runs")
    cpu: bool | None = option(None, "stay on the CPU even with a GPU/MPS")
    seed: int = option(0, "one seed for every stage", min=0)
    force: bool = option(False, "replace --out if an earlier `hitoban demo` made it")
    until: str | None = option(None, "stop after this stage: " + ", ".join(DEMO_STAGES), choices=DEMO_STAGES,
                               metavar="STAGE")
