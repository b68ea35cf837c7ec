"""Where to start: `hitoban demo` (the whole night in minutes) and `hitoban doctor` (is the install sound?)."""

from __future__ import annotations

from hitoban.start_options import DemoOptions, DoctorOptions
from hitoban.verbs import verb_of


@verb_of("doctor", "the device check before the night: the real pretrain loop, A/B saves, a kill and resume, compile, "
                   "eval bpc, generation with the KV-cache check, memory estimate vs peak (--cpu: quick install "
                   "check)", DoctorOptions)
def _doctor(options: DoctorOptions) -> int:
    if options.cpu:
        from hitoban.doctor import run_doctor

        report = run_doctor(options.out, steps=options.training_steps(), seed=options.seed)
        print(f"hitoban doctor --cpu: OK in {report['seconds']} s (report: {options.out}/doctor.json)")
        return 0
    from hitoban.device_check import run_device_check

    report = run_device_check(options.out, seed=options.seed, steps=options.training_steps(),
                              plant_fault=options.plant_fault)
    print(f"hitoban doctor: OK on {report['device']} in {report['seconds']} s (table: {options.out}/doctor.md)")
    return 0


@verb_of("demo", "the whole night in minutes: corpus -> tokenizer -> pretrain (killed + resumed) -> SFT -> eval -> "
                 "leak/PII checks -> card -> upload dry run", DemoOptions)
def _demo(options: DemoOptions) -> int:
    from hitoban.demo import run_demo

    run_demo(options.out, options.source, options.quick, options.cpu, options.seed, options.until, options.force)
    return 0
