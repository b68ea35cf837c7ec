"""Every command in README.md and in the guides in docs/ is run by a test (litgpt-style).

Each fenced block of every page (PAGES, read in this order: the recipe's state flows from page to page) is preceded
by `<!-- test: TAG -->`:
  ci       run here, in README order, in one work folder, with the sizes shrunk by SMALLER (paths point at
           the test corpus and the built-in data);
  install  what .ci/run itself does (install, pytest); `hitoban demo` is run by tests/hitoban/test_demo.py (--quick);
  network  needs the Hugging Face Hub (and a login to upload): marked `network`, run where it is reachable;
  gpu      needs several CUDA GPUs: run only where they exist;
  llama-cpp needs llama.cpp's Python binding (`pip install "hitoban[llama]"`, a compile): run where it is installed;
  summary  the README's eight commands: each must be a command of a guide's ci or network block (run there);
  reference the command reference (docs/commands.md): compared with the verbs' parsers in tests/test_docs.py.
A block without a tag fails the first test, so nothing in the pages can escape testing.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import alarm
import pytest
from conftest import CORPUS, REPO

PAGES = ["README.md"] + [f"docs/{name}.md" for name in ("recipe", "device", "machines", "publishing", "using",
                                                          "how-it-works", "testing", "benchmarks", "commands",
                                                          "design")]
TEXTS = {page: (REPO / page).read_text(encoding="utf-8") for page in PAGES}
README = TEXTS["README.md"]
BLOCK = re.compile(r"<!-- test: (?P<tag>[\w-]+) -->\n```(?P<lang>\w+)\n(?P<code>.*?)```", re.S)
PAGE_BLOCKS = [(page, m["tag"], m["lang"], m["code"]) for page in PAGES for m in BLOCK.finditer(TEXTS[page])]
BLOCKS = [(tag, lang, code) for _, tag, lang, code in PAGE_BLOCKS]
TAGS = {"ci", "install", "network", "gpu", "llama-cpp", "summary", "reference"}
BUILTIN = REPO / "hitoban" / "data"


def smaller(corpus: Path) -> list[tuple[str, str]]:
    """README text -> what CI runs instead, with the inputs taken from `corpus`. Every pattern must match (a README
    edit that drops one fails the test)."""
    return [
        ("--target-chars 1.2e9 --out data/corpus", "--target-chars 5e5 --out data/corpus"),
        ("--vocab-size 32000", "--vocab-size 4000"),
        ("--out data/shards\n", "--out data/shards --val-every 4 --shard-tokens 100000 --context 64\n"),
        ("--hours 8 ", "--hours 8 --candidate tiny:8 --steps 2 --warmup 1 "),
        ("--preset 3lm --batch-size 32 --work runs/killtest",
         "--preset tiny --batch-size 8 --context 64 --work runs/killtest --steps 20"),
        ("--preset 3lm --batch-size 32 --tokens 367608645", "--preset tiny --batch-size 8 --context 64 --steps 30"),
        ("--max-hours 8.5 --supervise", "--max-hours 8.5 --supervise --eval-every 10 --eval-batches 2 --no-progress"),
        ("--out runs/sft --exclude", "--out runs/sft --max-steps 10 --eval-steps 5 --batch-size 8 --exclude"),
        ("chats.jsonl", f"{corpus}/dialogue/real-persona-chat.messages.jsonl"),
        ("holdout.txt", f"{corpus}/3lm-eval/holdout_clean.txt"),
        ("tone.jsonl", f"{BUILTIN}/builtin_chat.jsonl"),
        ("eval/literature.txt", f"{corpus}/literature/000025_00201.txt"),
        ("eval/web.txt", f"{corpus}/web-or-wiki/rust-book-ja.txt"),
        ("questions.jsonl", f"{corpus}/3lm-eval/questions.jsonl"),
        ("--canaries 8 --corpus small.txt", f"--canaries 8 --corpus {BUILTIN}/builtin_ja.txt --steps 200"),
        ("hitoban secrets . --git", f"hitoban secrets {REPO} --git"),
        ("--out eval/bpc.json", "--out eval/bpc.json --max-chars 50000"),
        ('"your-name/hitoban-3lm"', '"runs/sft"'),
        ("--preset 3lm --tokens 1e9 --keys keys --min-machines 2",
         "--preset tiny --context 64 --batch-size 8 --tokens 8192 --inner-steps 4 --probe-steps 4 "
         "--eval-batches 2 --keys keys --min-machines 2"),
        ("--state machines/3060 >", "--state machines/3060 --cpu --wait-minutes 5 >"),
        ("--state machines/1050 >", "--state machines/1050 --cpu --wait-minutes 5 >"),
    ]


SMALLER = smaller(CORPUS)


def shrink(code: str, corpus: Path = CORPUS) -> str:
    for pattern, replacement in smaller(corpus):
        code = code.replace(pattern, replacement)
    return code


def shell_env(**extra: str) -> dict:
    """This environment, with the running interpreter's bin/ first on PATH (the `hitoban` script lives there)."""
    return {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}", **extra}


def run_block(lang: str, code: str, cwd, env) -> None:
    command = ["bash", "-euo", "pipefail", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=900)
    assert done.returncode == 0, f"README block failed:\n{code}\n--- stdout\n{done.stdout[-3000:]}\n" \
                                 f"--- stderr\n{done.stderr[-3000:]}"


def commands(code: str) -> list[str]:
    """Shell lines of a bash block, with backslash continuations joined."""
    return [line for line in code.replace("\\\n", " ").splitlines() if line.strip()]


COMMAND_SECONDS = 300  # each README command's own deadline (on a loaded 2-core machine), instead of one for all


@contextmanager
def deadline(seconds: int, what: str):
    """Fail the command that hangs, by name, instead of the whole README test at its global timeout; print its
    cost."""
    started = time.monotonic()
    try:
        with alarm.deadline(seconds, f"README command took more than {seconds} s: {what}"):
            yield
    finally:
        print(f"{time.monotonic() - started:7.1f} s  {what[:110]}", file=sys.__stderr__, flush=True)  # the cost


def run_in_process(lang: str, code: str, env) -> None:
    """`hitoban …` lines go straight to `hitoban.cli.main` and Python blocks to `exec` in this process: a fresh
    interpreter costs ~10 s of imports here, times 30 commands. Anything else (torchrun) runs in a shell."""
    from hitoban.cli import main

    if lang == "python":
        with deadline(COMMAND_SECONDS, code.splitlines()[0]):
            exec(compile(code, "README.md", "exec"), {"__name__": "__main__"})
        return
    for line in commands(code):
        argv = shlex.split(line, comments=True)
        with deadline(COMMAND_SECONDS, line):
            if argv[0] == "hitoban":
                assert main(argv[1:]) == 0, f"README command failed: {line}"
            else:
                run_block("bash", line, os.getcwd(), env)


def make_my_texts(folder, corpus: Path = CORPUS) -> None:
    """The recipe's `my_texts/`: real literature (linked from `corpus`) plus one document with three fake contacts
    (Faker), as real text would have, so the PII probe has something to try through the masked-value log."""
    from hitoban.demo_data import fake_notice

    folder.mkdir()
    books = sorted((corpus / "literature").glob("*.txt"))[:60]
    for book in books:
        (folder / book.name).symlink_to(book)
    snippets = ["".join(book.read_text(encoding="utf-8").split())[500:700] for book in books[:3]]
    (folder / "000000_notice.txt").write_text(fake_notice(snippets, seed=3), encoding="utf-8")  # sorts first


def test_a_hanging_readme_command_fails_by_name():
    with pytest.raises(TimeoutError, match="more than 1 s: sleep forever"):
        with deadline(1, "sleep forever"):
            time.sleep(5)


def test_every_code_block_is_tagged_and_every_substitution_applies():
    for page, text in TEXTS.items():
        fences = re.findall(r"^```\w+$", text, re.M)
        tagged = [b for b in PAGE_BLOCKS if b[0] == page]
        assert len(fences) == len(tagged), f"a code block in {page} has no <!-- test: TAG --> line above it"
    assert {tag for tag, _, _ in BLOCKS} <= TAGS
    assert all(page != "README.md" or tag in ("install", "summary") for page, tag, _, _ in PAGE_BLOCKS)  # a front page
    ci_text = "".join(code for tag, _, code in BLOCKS if tag in ("ci", "network", "gpu"))
    unused = [pattern for pattern, _ in SMALLER if pattern not in ci_text]
    assert not unused, f"the pages no longer contain {unused}: update SMALLER"
    install = "".join(code for tag, _, code in BLOCKS if tag == "install")
    ci_script = (REPO / ".ci" / "run").read_text()
    assert "hitoban demo" in install  # run by tests/hitoban/test_demo.py with --quick
    assert "pip install torch==2.13.0" in ci_script and 'pip install -e ".[dev]"' in ci_script
    assert "python -m pytest -q" in install and "python -m pytest -q" in ci_script


def argv_of(line: str) -> list[str]:
    return shlex.split(line, comments=True)


def summary_misses(blocks: list[tuple[str, str, str, str]]) -> list[str]:
    """The README's summary commands that are not, word for word, a command of a guide's ci or network block."""
    guided = {tuple(argv_of(line)) for page, tag, lang, code in blocks
              if page != "README.md" and tag in ("ci", "network") and lang == "bash" for line in commands(code)}
    return [line for page, tag, _, code in blocks if tag == "summary" for line in commands(code)
            if tuple(argv_of(line)) not in guided]


def test_the_front_pages_commands_are_the_recipes():
    """The eight commands on the front page are run where the recipe runs them; none may drift from it. Negative
    control: a changed option in the summary is reported."""
    assert len([line for tag, _, code in BLOCKS if tag == "summary" for line in commands(code)]) == 8
    assert summary_misses(PAGE_BLOCKS) == []
    drifted = [(p, t, lang, c.replace("--vocab-size 32000", "--vocab-size 16000") if t == "summary" else c)
               for p, t, lang, c in PAGE_BLOCKS]
    assert summary_misses(drifted) == ["hitoban tokenizer --corpus data/corpus --out data/tok --vocab-size 16000"]


@pytest.mark.slow(seconds=285)
@pytest.mark.timeout(1800)  # the sum of the commands; each one has its own COMMAND_SECONDS deadline
def test_every_ci_command_in_the_readme_runs(tmp_path, monkeypatch, large_corpus):
    """The recipe is written for more text than its shrunk --target-chars 5e5: it reads the larger corpus where
    there is one (conftest.large_corpus), the repository's tests/corpus otherwise."""
    env = shell_env(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # `hitoban chat` reads until end of input
    make_my_texts(tmp_path / "my_texts", large_corpus)
    for tag, lang, code in BLOCKS:
        if tag == "ci":
            run_in_process(lang, shrink(code, large_corpus), env)
    # what the recipe promised to leave behind
    for path in ("data/corpus/manifest.json", "data/shards/shards_index.json", "runs/night/final/model.safetensors",
                 "runs/killtest/killtest.json", "runs/sft/summary.json", "runs/tone/summary.json",
                 "eval/bpc.png", "eval/gen.json", "eval/compare/compare.png", "eval/leaks.json",
                 "eval/canaries/canary_control.json", "runs/sft/README.md", "runs/sft-llama/config.json",
                 "runs/tone-trainer/model.safetensors", "runs/ddp/log.jsonl", "runs/tone-lora/adapter_config.json",
                 "runs/tone-merged/model.safetensors", "runs/tone-merged/adapter/adapter_model.safetensors",
                 "runs/sft.gguf", "runs/sft-q8_0.gguf", "runs/night.gguf", "runs/sft.Modelfile",
                 "runs/sft-llama/tokenizer.model", "runs/federated/final/lineage.json", "machines/1050/DONE",
                 "runs/night/tensorboard", "runs/night/trackers.json", "runs/sft-llama/README.md",
                 "runs/tone-llama/config.json"):
        assert (tmp_path / path).exists(), path
    model_configs = [json.loads(p.read_text()) for p in (tmp_path / "runs").rglob("config.json")
                     if not p.parent.name.startswith("checkpoint-")]  # the Trainer's own resume points
    model_configs = [c for c in model_configs if "model_type" in c]  # not the runs' own config.json
    assert len(model_configs) >= 5 and all(c.get("use_cache") is True for c in model_configs)  # a plain call caches
    card = (tmp_path / "runs/sft/README.md").read_text(encoding="utf-8")
    assert "| literature |" in card and "prefix attack tried" in card
    assert "Muon on hidden matrices + AdamW on the rest, warmup-stable-decay schedule" in card  # the run's own recipe
    assert "the kill test ran this run's exact configuration" in card  # not the kill test's own base run
    numbers = json.loads((tmp_path / "runs/sft/eval_results.json").read_text(encoding="utf-8"))
    assert numbers["sources"]["run"] == "runs/night/config.json" and numbers["sources"]["killtest"] == \
        "runs/killtest/killtest.json"
    pii = json.loads((tmp_path / "runs/sft/pii.json").read_text(encoding="utf-8"))
    assert pii["status"] == "measured" and pii["mining"]["from_masked_log"] == 6  # 3 e-mails + 3 phones tried


@pytest.mark.slow
def test_llama_cpp_commands_in_the_readme(tmp_path, pretrained, monkeypatch):
    """The GGUF blocks that need llama.cpp, on a pretrained model standing in for runs/sft; llama.cpp's converter
    comes from llama-cpp-python's source archive (tests/modeling/test_gguf.py fetches it)."""
    pytest.importorskip("llama_cpp", reason="llama.cpp runs only where pip install 'hitoban[llama]' was done")
    from test_gguf import _convert_script

    script = _convert_script()
    if script is None:
        pytest.skip("llama-cpp-python's source archive could not be fetched (no package registry)")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "sft").symlink_to(pretrained)
    from hitoban.cli import main

    assert main(["export-llama", "runs/sft", "runs/sft-llama"]) == 0
    for tag, lang, code in BLOCKS:
        if tag == "llama-cpp":
            code = code.replace("python llama.cpp/convert_hf_to_gguf.py", f"{sys.executable} {script}")
            run_in_process(lang, code, shell_env())
    assert (tmp_path / "runs/sft-checked.gguf").exists() and (tmp_path / "runs/sft-llama.gguf").exists()


@pytest.mark.network
def test_network_commands_in_the_readme(tmp_path):
    """The Hub-streamed corpus (no login needed). The upload blocks need a trained model and a login; the same
    upload path runs against the real Hub in tests/release/test_upload.py::test_real_hub_upload_round_trip."""
    env = shell_env(HF_HUB_OFFLINE="0")
    corpus_block = next(code for tag, _, code in BLOCKS if tag == "network" and "hitoban corpus" in code)
    run_block("bash", corpus_block.replace("1.2e9", "2e5"), tmp_path, env)
    assert (tmp_path / "data/corpus/manifest.json").exists()


def test_gpu_commands_in_the_readme(tmp_path, tiny_shards):
    import torch

    gpus = torch.cuda.device_count()
    if gpus < 2:
        pytest.skip("needs 2+ CUDA GPUs (the same DDP code runs on CPU in test_every_ci_command_in_the_readme)")
    for tag, lang, code in BLOCKS:
        if tag == "gpu":
            code = (code.replace("--num_processes 4", f"--num_processes {gpus}")
                    .replace("data/shards", str(tiny_shards))
                    .replace("--preset 3lm --batch-size 64 --tokens 1e9",
                             f"--preset tiny --batch-size {8 * gpus} --context 64 --steps 10"))
            run_block(lang, code, tmp_path, shell_env())
