"""Where to start: `hitoban demo` (the whole night in minutes) and `hitoban doctor` (is the install sound?)."""

from __future__ import annotations

from hitoban.options import ranged
from hitoban.verbs import verb


def _doctor_args(p):
    p.add_argument("--out", default="hitoban-doctor", help="folder for everything the check makes and doctor.json")
    p.add_argument("--cpu", action="store_true",
                   help="the quick install check on the CPU instead (tokenizer, a tiny model trained --steps steps, "
                        "generation, save and reload)")
    p.add_argument("--steps", type=ranged(int, min=1), default=None,
                   help="training steps (default: 40 for the device check's kill test, 200 for --cpu)")
    p.add_argument("--seed", type=ranged(int, min=0), default=0, help="seed for the tiny model and its batches")
    p.add_argument("--plant-fault", choices=("drop-optimizer-state",), default=None,
                   help="prove the check can fail: the kill test's resume drops the optimizer state (must FAIL)")


@verb("doctor", "the device check before the night: the real pretrain loop, A/B saves, a kill and resume, compile, "
                "eval bpc, generation with the KV-cache check, memory estimate vs peak (--cpu: quick install "
                "check)")(_doctor_args)
def _doctor(args) -> int:
    if args.cpu:
        from hitoban.doctor import run_doctor

        report = run_doctor(args.out, steps=args.steps or 200, seed=args.seed)
        print(f"hitoban doctor --cpu: OK in {report['seconds']} s (report: {args.out}/doctor.json)")
        return 0
    from hitoban.device_check import STEPS, run_device_check

    report = run_device_check(args.out, seed=args.seed, steps=args.steps or STEPS, plant_fault=args.plant_fault)
    print(f"hitoban doctor: OK on {report['device']} in {report['seconds']} s (table: {args.out}/doctor.md)")
    return 0


def _demo_args(p):
    p.add_argument("--out", default="hitoban-demo", help="new folder for everything the demo makes (+ report.md)")
    p.add_argument("--source", nargs="+", default=["builtin"], metavar="builtin|aozora|fineweb2-ja|PATH",
                   help="pretraining text: the built-in Japanese text (offline, default), a pinned slice of Aozora "
                        "Bunko or FineWeb-2 (network), or your own files")
    p.add_argument("--quick", action="store_true", help="fewer steps everywhere (CI); every stage still runs")
    p.add_argument("--cpu", action="store_true", default=None, help="stay on the CPU even with a GPU/MPS")
    p.add_argument("--seed", type=ranged(int, min=0), default=0, help="one seed for every stage")
    p.add_argument("--force", action="store_true", help="replace --out if an earlier `hitoban demo` made it")
    p.add_argument("--until", metavar="STAGE", help="stop after this stage (corpus, tokenizer, shards, calibrate, "
                                                    "pretrain, sft, eval, leaks, pii, card, upload)")


@verb("demo", "the whole night in minutes: corpus -> tokenizer -> pretrain (killed + resumed) -> SFT -> eval -> "
              "leak/PII checks -> card -> upload dry run")(_demo_args)
def _demo(args) -> int:
    from hitoban.demo import run_demo

    run_demo(args.out, args.source, args.quick, args.cpu, args.seed, args.until, args.force)
    return 0
