"""The night's verbs: calibrate, the kill test, pretraining, watching it and its figures."""

from __future__ import annotations

from pathlib import Path

from hitoban.errors import ExitCode
from hitoban.evaluation.options import PlotOptions
from hitoban.training.pretrain.options import CalibrateOptions, WatchOptions
from hitoban.verbs import verb, verb_of


def _pretrain_args(p):
    from hitoban.options import add_options
    from hitoban.training.pretrain.options import PretrainConfig, SuperviseOptions

    add_options(p, PretrainConfig)
    add_options(p, SuperviseOptions)


@verb("pretrain", "pretrain on shards with crash-safe A/B checkpoints and exact resume (Accelerate)")(_pretrain_args)
def _pretrain(args) -> int:
    from hitoban.options import from_args
    from hitoban.training.pretrain.options import PretrainConfig
    from hitoban.training.pretrain.trainer import pretrain

    if args.supervise:
        from hitoban.training.pretrain.supervise import supervise

        return supervise(args.argv, Path(args.out), args.max_restarts)
    cfg = from_args(PretrainConfig, args)
    try:
        pretrain(cfg)
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():  # tear gloo/NCCL down before exit (else: abort at exit)
            dist.destroy_process_group()
    return 0


def _killtest_args(p):
    from hitoban.options import add_options
    from hitoban.training.pretrain.options import KillTestOptions

    add_options(p, KillTestOptions)


@verb("killtest", "SIGKILL a real run of the night's configuration twice (once mid-save), resume, compare with an "
                  "uninterrupted run")(_killtest_args)
def _killtest(args) -> int:
    from hitoban.evaluation.plots import plot_killtest
    from hitoban.options import argv_for, from_args, to_argv
    from hitoban.training.pretrain.killtest import run_killtest
    from hitoban.training.pretrain.options import KillTestOptions, PretrainConfig, TrainingOptions

    options = from_args(KillTestOptions, args)
    night = to_argv(options, TrainingOptions) + argv_for(PretrainConfig, eval_every=options.eval_every)
    result = run_killtest(options.data, options.work, night, steps=options.steps, kills=options.kills)
    plot_killtest(result, Path(options.work) / "killtest.png")
    failed = [name for name, ok in result["checks"].items() if not ok]
    print(f"kill test {'PASSED' if result['passed'] else 'FAILED: ' + ', '.join(failed)} ({result['mode']}, "
          f"{result['seconds']} s) -> {options.work}/killtest.json, killtest.png")
    return 0 if result["passed"] else int(ExitCode.CHECK_FAILED)


@verb_of("watch", "show a run's progress, ETA and health from its heartbeat", WatchOptions)
def _watch(options: WatchOptions) -> int:
    from hitoban.training.pretrain.watch import watch

    watch(options.run, options.interval, options.once)
    return 0


@verb_of("calibrate", "measure tok/s per model/batch and pick the run closest to D/N = 20 for the night",
         CalibrateOptions)
def _calibrate(options: CalibrateOptions) -> int:
    from hitoban.training.pretrain.calibrate import calibrate

    print(f"{'candidate':<16}{'params':>8}{'non-emb':>9}{'tok/s':>17}{'memory':>10}{'tokens':>22}{'D/N':>11}")
    result = calibrate(options)
    print(f"selected {result['selected']} (D/N closest to 20): {result['sureness']}; run:\n  {result['command']}")
    return 0


@verb_of("plot", "loss curves (train, val, per-domain val, resumes) and the kill-test figure as PNG", PlotOptions)
def _plot(options: PlotOptions) -> int:
    from hitoban.evaluation.plots import plot_run

    print("written: " + ", ".join(str(p) for p in plot_run(options.run, options.out)))
    return 0
