"""The install check (`doctor`), the KV-cache check with its negative control, and the CLI surface."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from hypothesis import given, settings
from hypothesis import strategies as st

from hitoban.cli import VERB_NAMES, main
from hitoban.doctor import run_doctor
from hitoban.evaluation.kvcache import check_kvcache


def test_kvcache_check_passes_on_the_real_cache():
    result = check_kvcache()
    assert result["passed"] and result["max_abs_diff"] <= 1e-5 and result["positions_checked"] == 13


def test_kvcache_check_fails_when_the_rope_offset_is_broken():
    result = check_kvcache(break_rope_offset=True)
    assert not result["passed"] and result["max_abs_diff"] > 1e-2


def test_kvcache_cli_exit_codes(capsys):
    assert main(["check-kvcache"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["check-kvcache", "--break-rope-offset"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_kvcache_check_on_a_saved_model(tiny_model_dir, capsys):
    assert main(["check-kvcache", "--model", str(tiny_model_dir)]) == 0


def test_doctor_trains_generates_saves_and_reloads(tmp_path):
    report = run_doctor(tmp_path, steps=120, log=lambda *_: None)
    assert report["loss_last"] < report["loss_first"] - 1.0
    assert report["reload_max_abs_diff"] == 0.0 and report["reload_same_generation"]
    assert report["generation"].startswith("夜の研究室は")
    assert json.loads((tmp_path / "doctor.json").read_text())["steps"] == 120
    assert (tmp_path / "model" / "model.safetensors").exists() and (tmp_path / "model" / "tokenizer.json").exists()


def test_doctor_fails_loudly_when_training_cannot_learn(tmp_path):
    with pytest.raises(RuntimeError, match="loss did not fall"):
        run_doctor(tmp_path, steps=1, log=lambda *_: None)


@pytest.mark.slow
def test_the_device_checks_bits_per_char_row_fails_on_a_model_that_learnt_nothing(tiny_model_dir, corpus):
    """Negative control for the doctor's bits/char row (its pass is in the test below): random weights made
    confident (the tied output projection scaled up) predict worse than a uniform model, and the row fails."""
    import torch

    from hitoban.device_check import _bpc
    from hitoban.modeling.loading import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    held_out = sorted((corpus / "literature").glob("*.txt"))[0].read_text(encoding="utf-8")[:3000]
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(40)
    passed, detail, bpc = _bpc(model, tokenizer, held_out)
    uniform = float(detail.split("uniform: ")[1].rstrip(")"))
    assert not passed and bpc > uniform


@pytest.mark.slow(seconds=90)  # the doctor twice: kill test processes, a night, generation (~75 s on 2 cores)
def test_the_device_check_runs_the_night_on_this_device_and_fails_on_a_planted_fault(tmp_path, capsys):
    from hitoban.device_check import run_device_check
    report = run_device_check(tmp_path / "ok", steps=30, log=lambda *_: None)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["passed"] and set(checks) == {"device", "data", "kill and resume", "night in-process",
                                                "memory estimate", "resume placement", "bits/char", "generation"}
    assert checks["kill and resume"]["passed"] and "bit-identical" in checks["kill and resume"]["detail"]
    assert checks["memory estimate"]["passed"] and "profiler memory timeline" in checks["memory estimate"]["detail"]
    assert "compile auto" in checks["night in-process"]["detail"]
    table = (tmp_path / "ok" / "doctor.md").read_text()
    assert table.count("\n") == len(checks) + 2  # one line per check
    # the negative control: a resume that drops the optimizer state fails the doctor, through the command line
    assert main(["doctor", "--out", str(tmp_path / "fault"), "--steps", "30", "--plant-fault",
                 "drop-optimizer-state"]) == 1
    fault = json.loads((tmp_path / "fault" / "doctor.json").read_text())
    failed = {c["name"]: c for c in fault["checks"]}
    assert failed["kill and resume"]["passed"] is False and "killed_run_matches" in failed["kill and resume"]["detail"]
    assert "hitoban doctor failed on cpu: kill and resume" in capsys.readouterr().err
    # the checks after the planted kill test are not run, and said so: a control never reads as a pass
    assert list(failed) == ["device", "data", "kill and resume"] and not fault["passed"]
    assert fault["not_run"] == [name for name in checks if name not in failed]
    assert "Not run (--plant-fault drop-optimizer-state): night in-process" in (tmp_path / "fault" / "doctor.md"
                                                                               ).read_text()


def test_a_planted_fault_the_kill_test_does_not_see_fails_the_doctor(tmp_path, monkeypatch, capsys):
    """The control's own negative side: were the kill test blind to the fault, --plant-fault must not exit 0 with
    the later checks unrun (here the kill test is replaced by one that always passes)."""
    from hitoban import device_check

    monkeypatch.setattr(device_check, "_killtest", lambda *_: (True, "blind", None))
    monkeypatch.setattr(device_check, "_data", lambda *_: (True, "stand-in", "held-out text"))
    assert main(["doctor", "--out", str(tmp_path / "blind"), "--plant-fault", "drop-optimizer-state"]) == 1
    assert "the kill test did not see the planted fault" in capsys.readouterr().err
    assert not json.loads((tmp_path / "blind" / "doctor.json").read_text())["passed"]


@pytest.mark.parametrize("verb", VERB_NAMES)  # every verb: hitoban.cli's list, not the registry (filled on import)
def test_every_verb_explains_itself(verb, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([verb, "--help"])
    assert exit_info.value.code == 0
    assert len(capsys.readouterr().out) > 100


def test_console_script_is_installed():
    """The `hitoban` script pip installed (next to this Python), not `python -m hitoban.cli`."""
    script = Path(sys.executable).parent / "hitoban"
    assert script.exists(), f"no console script at {script}: is the package installed (pip install -e .)?"
    run = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("hitoban "), run.stderr[-2000:]


@pytest.mark.slow  # builds and installs a wheel (~7-8 s)
def test_non_editable_install_has_every_area_package_and_the_builtin_text(tmp_path):
    """pip install . (not -e): package_dir must map modeling/ training/ ... to hitoban.*, with the data files and
    the Gradio Space."""
    repo = REPO
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path / "wheel"), str(repo)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next((tmp_path / "wheel").glob("hitoban-*.whl"))
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                              str(tmp_path / "site"), str(wheel)], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-2000:]
    code = ("import hitoban, hitoban.modeling, hitoban.training.pretrain.trainer, hitoban.evaluation.kvcache;"
            "import hitoban.release, hitoban.training.data.reader, hitoban.training.finetune.sft;"
            "from hitoban.training.data.corpus import builtin_documents; assert len(builtin_documents()) > 10;"
            "from hitoban.demo_data import builtin_chats; assert len(builtin_chats()) >= 50;"
            "from hitoban.release.upload import space_source; s = space_source();"
            "assert (s / 'requirements.txt').exists() and str(s).startswith(hitoban.__file__.rsplit('/', 2)[0]);"
            "print(hitoban.__file__)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={**__import__("os").environ, "PYTHONPATH": str(tmp_path / "site")})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().startswith(str(tmp_path / "site"))


def test_every_option_of_every_verb_explains_itself_with_its_default(capsys):
    import argparse

    from hitoban.cli import PIPELINE, build_parser

    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert list(verbs) == [name for names in PIPELINE.values() for name in names]  # pipeline order
    for name, sub in verbs.items():
        undocumented = [a.dest for a in sub._actions if not a.help]
        assert not undocumented, f"hitoban {name}: options without help: {undocumented}"
        with pytest.raises(SystemExit):
            main([name, "--help"])
        text = capsys.readouterr().out
        assert sub.description in " ".join(text.split()) or name in text
    main_help = build_parser().format_help()
    positions = [main_help.index(f"\n  {verb} ") for verb in ("corpus", "pretrain", "sft", "upload")]
    assert positions == sorted(positions)
    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    assert "(default: with muon 0.0127 x (256 / the preset's width) ^ 0.89, fitted by benchmarks/bench_lr.py, no " \
           "depth term: within 1.5x of the optimum at depths 2-8; 0.0006 with adamw, 3LM's)" in \
        " ".join(capsys.readouterr().out.split())  # --lr's default, training/optimizer.py


def test_the_console_script_help_loads_neither_torch_nor_transformers():
    """`hitoban --help` answered after 5-8 s of imports; as the console script, the package now loads torch only
    when a verb needs it."""
    code = ("import sys; sys.argv = ['hitoban', '--help']\n"
            "from hitoban.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('heavy:', sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "verbs, in the order a night goes" in done.stdout and "heavy: []" in done.stdout, done.stderr[-2000:]


@pytest.mark.slow  # a process of its own that loads a model (~8 s): the full suite runs it
def test_the_console_script_runs_a_verb_that_loads_a_model(tiny_model_dir):
    """As the console script the package imports the model lazily; a verb that loads a saved folder through the
    Auto classes must still find them registered."""
    code = ("import sys; sys.argv = ['hitoban', 'check-kvcache', '--model', sys.argv[1]]\n"
            "from hitoban.cli import main\n"
            "raise SystemExit(main())")
    done = subprocess.run([sys.executable, "-c", code, str(tiny_model_dir)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "kv-cache check PASS" in done.stdout, done.stderr[-2000:]


@settings(max_examples=200)
@given(st.integers(0, 2**34), st.integers(0, 2**34), st.one_of(st.none(), st.integers(1, 2**34)))
def test_the_memory_row_passes_only_an_estimate_that_covers_the_peak_where_its_logits_matter(
        estimate, without_logits, peak):
    """Issue 34: the row certifies the estimate only where the measurement could have caught it out."""
    from hitoban.device_check import judge_memory

    passed, detail = judge_memory(estimate, without_logits, peak, "measured")
    expected = None if peak is None else without_logits < peak <= estimate
    assert passed is expected
    assert ("UNDERESTIMATED" in detail) == (peak is not None and estimate < peak)


@pytest.mark.slow
def test_the_memory_row_measures_a_step_and_fails_an_estimate_without_its_logits(monkeypatch):
    """Issue 34: the doctor's memory row measures a real step (the profiler's timeline on a CPU; the allocator's
    peak after a warm-up on CUDA) at a shape where the logits dominate. Negative control: the preflight's estimate
    with its logits term left out fails the same row."""
    from hitoban.device_check import _memory
    from hitoban.training import memory

    passed, detail, peak = _memory(cpu=True)
    assert passed is True and peak > 0, detail
    monkeypatch.setattr(memory, "logits_bytes", lambda *args: 0)
    passed, detail, again = _memory(cpu=True)
    assert passed is False and "UNDERESTIMATED" in detail


def test_every_value_the_help_promises_is_accepted():
    """`--near-dup`'s help said "0 turns it off" and its check refused 0 ("must be above 0"). Every option of every
    verb whose help names a value that turns it off ("0: off", "0 turns it off") accepts that value."""
    import argparse
    import re

    from hitoban.cli import build_parser

    promised = re.compile(r"\b(\d+(?:\.\d+)?)(?::| turns (?:it )?| disables)\s*off|\b(\d+(?:\.\d+)?) disables")
    checked = 0
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for verb, parser in sub.choices.items():
        for action in parser._actions:
            for match in promised.finditer(action.help or ""):
                value = match.group(1) or match.group(2)
                converted = action.type(value) if action.type else value  # raises ArgumentTypeError if refused
                assert float(converted) == float(value), (verb, action.option_strings)
                checked += 1
    assert checked >= 2  # --near-dup and --grad-clip at least: the scan reads the real help


def described(parser) -> list[tuple]:
    """Everything a parser's options say: flags, destination, default, type, choices, count, whether required,
    help."""
    return [(tuple(a.option_strings), a.dest, repr(a.default), getattr(a.type, "__name__", a.type),
             tuple(a.choices or ()), a.nargs, a.required, a.help) for a in parser._actions]


def test_a_verb_parsed_alone_has_the_options_of_the_whole_parser():
    """`main` builds only the verb it runs (hitoban.cli.build_parser(verb)): for every verb, what the parser built
    for it alone offers is what the whole parser offers under that verb's name."""
    import argparse

    from hitoban.cli import build_parser

    def verb_parser(parser, name):
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]

    whole = build_parser()
    for name in VERB_NAMES:
        alone = build_parser(name)
        assert list(next(a for a in alone._actions if isinstance(a, argparse._SubParsersAction)).choices) == [name]
        assert described(verb_parser(alone, name)) == described(verb_parser(whole, name)), name


@pytest.mark.slow  # eight fresh processes (~5 s): the full suite runs it
def test_a_verb_imports_only_its_own_verbs_module():
    """Each command imports the module of hitoban/verbs/ that holds its verb, not the other seven (a tenth of a
    second of every command's start-up): one verb of each group, in a fresh process."""
    from hitoban.cli import MODULES, PIPELINE

    probe = ("import sys\nfrom hitoban.cli import main\ntry:\n    main([sys.argv[1], '--help'])\nexcept SystemExit:\n"
             "    pass\nprint(sorted(m for m in sys.modules if m.startswith('hitoban.verbs.')))")
    for group, names in PIPELINE.items():
        done = subprocess.run([sys.executable, "-c", probe, names[-1]], capture_output=True, text=True, check=True)
        assert done.stdout.strip().splitlines()[-1] == str([f"hitoban.verbs.{MODULES[group]}"]), (group, done.stdout)
