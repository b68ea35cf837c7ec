"""`import hitoban` is the same in every process (issue 36: it used to read sys.argv to guess whether it was the
console script): it loads neither torch nor transformers by itself, and the Auto classes are registered once
transformers is there, imported before hitoban or after it. Each case runs in a fresh process."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO

IMPORT_THEN_TRANSFORMERS = textwrap.dedent("""
    import json, sys
    sys.argv = [sys.argv[1]]  # what the package once guessed from: it must not matter now
    import hitoban
    light = sorted({"torch", "transformers"} & set(sys.modules))
    hooked = any(type(f).__name__ == "_RegisterAfterTransformers" for f in sys.meta_path)
    from transformers import AutoModelForCausalLM  # the first import of transformers registers the model
    model = AutoModelForCausalLM.from_pretrained(FOLDER)  # no trust_remote_code
    print(json.dumps({"light": light, "hooked": hooked, "class": type(model).__module__ + "." + type(model).__name__,
                      "hook_left": any(type(f).__name__ == "_RegisterAfterTransformers" for f in sys.meta_path)}))
""")


def run(code: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_import_hitoban_is_light_and_registers_when_transformers_comes_after(tiny_model_dir):
    """The README's order (`import hitoban`, then `from transformers import AutoModelForCausalLM`) loads a hitoban
    folder without remote code, whatever sys.argv[0] is (the console script's name included); `import hitoban`
    alone imports neither torch nor transformers (the behaviour change: it used to import both, outside the
    console script), and the one-shot hook is gone once it has registered."""
    for argv0 in ("hitoban", "-c"):
        code = IMPORT_THEN_TRANSFORMERS.replace("FOLDER", repr(str(tiny_model_dir)))
        result = run(code, argv0)
        assert result == {"light": [], "hooked": True, "hook_left": False,
                          "class": "hitoban.modeling.modeling_hitoban.HitobanForCausalLM"}, (argv0, result)


@pytest.mark.slow
def test_import_hitoban_after_transformers_registers_at_once_and_model_names_load_on_use():
    code = textwrap.dedent("""
        import json, sys
        import transformers
        import hitoban
        from transformers import AutoConfig
        registered = type(AutoConfig.for_model("hitoban")).__name__
        hooked = any(type(f).__name__ == "_RegisterAfterTransformers" for f in sys.meta_path)
        print(json.dumps({"registered": registered, "hooked": hooked,
                          "names": [getattr(hitoban, n).__name__ for n in ("HitobanConfig", "HitobanForCausalLM")]}))
    """)
    assert run(code) == {"registered": "HitobanConfig", "hooked": False,
                         "names": ["HitobanConfig", "HitobanForCausalLM"]}


def test_python_m_hitoban_is_the_command_and_stays_light():
    code = textwrap.dedent("""
        import json, runpy, sys
        sys.argv = ["hitoban", "--help"]
        try:
            runpy.run_module("hitoban", run_name="__main__")
        except SystemExit as done:
            code = done.code
        print(json.dumps({"code": code, "heavy": sorted({"torch", "transformers"} & set(sys.modules))}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "verbs, in the order a night goes" in done.stdout, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"code": 0, "heavy": []}


def test_the_package_never_reads_sys_argv():
    tree = ast.parse((REPO / "hitoban" / "__init__.py").read_text(encoding="utf-8"))
    reads = [node.lineno for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and node.attr in ("argv", "orig_argv")]
    assert reads == [], f"hitoban/__init__.py reads sys.argv at lines {reads}"
