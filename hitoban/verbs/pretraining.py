"""The night's verbs: calibrate, the kill test, pretraining, watching it and its figures."""

from __future__ import annotations

from pathlib import Path

from hitoban.errors import ExitCode
from hitoban.verbs import verb


def _pretrain_args(p):
    from hitoban.training.options import PretrainConfig, add_options

    add_options(p, PretrainConfig)
    p.add_argument("--supervise", action="store_true",
                   help="relaunch after a crash while the saved step advances; keep the machine awake")
    p.add_argument("--max-restarts", type=int, default=40, help="--supervise: give up after this many relaunches")


@verb("pretrain", "pretrain on shards with crash-safe A/B checkpoints and exact resume (Accelerate)")(_pretrain_args)
def _pretrain(args) -> int:
    from hitoban.training.options import PretrainConfig, from_args
    from hitoban.training.pretrain import pretrain

    if args.supervise:
        from hitoban.training.supervise import supervise

        argv = [a for a in args.argv if a != "--supervise"]
        return supervise(argv, Path(args.out), args.max_restarts)
    cfg = from_args(PretrainConfig, args)
    try:
        pretrain(cfg)
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():  # tear gloo/NCCL down before exit (else: abort at exit)
            dist.destroy_process_group()
    return 0


def _killtest_args(p):
    from hitoban.training.options import TrainingOptions, add_options

    add_options(p, TrainingOptions)
    p.add_argument("--work", default="hitoban-killtest", help="scratch folder; killtest.json and .png land here")
    p.add_argument("--steps", type=int, default=60, help="length of each run (the night's other options are kept)")
    p.add_argument("--kills", type=int, default=2, help="SIGKILLs (the first lands inside a checkpoint save)")
    p.add_argument("--eval-every", type=int, help="validation every N steps (default: at the end only)")


@verb("killtest", "SIGKILL a real run of the night's configuration twice (once mid-save), resume, compare with an "
                  "uninterrupted run")(_killtest_args)
def _killtest(args) -> int:
    from hitoban.evaluation.plots import plot_killtest
    from hitoban.training.killtest import run_killtest
    from hitoban.training.options import TrainingOptions, from_args, to_argv

    options = to_argv(from_args(TrainingOptions, args))
    options += ["--eval-every", str(args.eval_every)] if args.eval_every else []
    result = run_killtest(args.data, args.work, options, steps=args.steps, kills=args.kills)
    plot_killtest(result, Path(args.work) / "killtest.png")
    failed = [name for name, ok in result["checks"].items() if not ok]
    print(f"kill test {'PASSED' if result['passed'] else 'FAILED: ' + ', '.join(failed)} ({result['mode']}, "
          f"{result['seconds']} s) -> {args.work}/killtest.json, killtest.png")
    return 0 if result["passed"] else int(ExitCode.CHECK_FAILED)


def _watch_args(p):
    p.add_argument("run", help="a pretraining run folder")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between refreshes")
    p.add_argument("--once", action="store_true", help="print once and exit")


@verb("watch", "show a run's progress, ETA and health from its heartbeat")(_watch_args)
def _watch(args) -> int:
    from hitoban.training.watch import watch

    watch(args.run, args.interval, args.once)
    return 0


def _calibrate_args(p):
    from hitoban.training.options import TrainingOptions, add_options

    add_options(p, TrainingOptions, only=("data", "context", "precision", "cpu"), optional=("data",))
    p.add_argument("--hours", type=float, default=8.0, help="length of the night")
    p.add_argument("--candidate", action="append", metavar="PRESET:BATCH",
                   help="repeatable; default: tiny:8 small:16 3lm:24 3lm:32 3lm:48 zxell-s:16")
    p.add_argument("--vocab-size", type=int, default=32000, help="vocabulary without --data (with it: the shards')")
    p.add_argument("--steps", type=int, default=10,
                   help="timed steps per candidate at least (after --warmup); more, up to a minute, until the "
                        "timings settle within 10%%")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (allocation, kernel selection)")
    p.add_argument("--compile", choices=["on", "off"], default="off",
                   help="measure the compiled step (compile time excluded, as --hours does)")
    p.add_argument("--out", help="also write the table as JSON")


@verb("calibrate", "measure tok/s per model/batch and pick the run closest to D/N = 20 for the night")(
    _calibrate_args)
def _calibrate(args) -> int:
    from hitoban.training.calibrate import DEFAULT_CANDIDATES, calibrate

    print(f"{'candidate':<16}{'params':>8}{'non-emb':>9}{'tok/s':>17}{'memory':>10}{'tokens':>22}{'D/N':>11}")
    result = calibrate(args.candidate or DEFAULT_CANDIDATES, args.hours, args.data, args.vocab_size, args.context,
                       args.steps, args.warmup, args.cpu, args.precision, args.compile, out=args.out)
    print(f"selected {result['selected']} (D/N closest to 20): {result['sureness']}; run:\n  {result['command']}")
    return 0


def _plot_args(p):
    p.add_argument("run", help="a pretraining run folder (log.jsonl; killtest.json if present)")
    p.add_argument("--out", help="folder for the PNGs (default RUN/plots)")


@verb("plot", "loss curves (train, val, per-domain val, resumes) and the kill-test figure as PNG")(_plot_args)
def _plot(args) -> int:
    from hitoban.evaluation.plots import plot_run

    print("written: " + ", ".join(str(p) for p in plot_run(args.run, args.out)))
    return 0
