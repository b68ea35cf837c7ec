"""The install check (`doctor`), the KV-cache check with its negative control, and the CLI surface."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hitoban.cli import VERBS, main
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


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verb_explains_itself(verb, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([verb, "--help"])
    assert exit_info.value.code == 0
    assert len(capsys.readouterr().out) > 100


def test_console_script_is_installed():
    run = subprocess.run([sys.executable, "-m", "hitoban.cli", "--version"], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("hitoban ")


def test_non_editable_install_has_every_area_package_and_the_builtin_text(tmp_path):
    """pip install . (not -e): package_dir must map modeling/ training/ ... to hitoban.*, with the data files and
    the Gradio Space."""
    repo = __import__("pathlib").Path(__file__).resolve().parents[1]
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path / "wheel"), str(repo)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next((tmp_path / "wheel").glob("hitoban-*.whl"))
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                              str(tmp_path / "site"), str(wheel)], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-2000:]
    code = ("import hitoban, hitoban.modeling, hitoban.training.pretrain, hitoban.evaluation.kvcache, hitoban.release;"
            "from hitoban.doctor import builtin_documents; assert len(builtin_documents()) > 10;"
            "from hitoban.demo import builtin_chats; assert len(builtin_chats()) >= 50;"
            "from hitoban.release.upload import space_source; s = space_source();"
            "assert (s / 'requirements.txt').exists() and str(s).startswith(hitoban.__file__.rsplit('/', 2)[0]);"
            "print(hitoban.__file__)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={**__import__("os").environ, "PYTHONPATH": str(tmp_path / "site")})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().startswith(str(tmp_path / "site"))
