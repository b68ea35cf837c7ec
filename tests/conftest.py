"""Shared fixtures. Real Japanese text comes from tests/corpus, a small licence-clean corpus shipped with the
repository (sources, licences and sizes in tests/corpus/README.md), so a fresh clone runs every test on its own.

Slow tests that want more text than that ask for the `large_corpus` fixture: a larger corpus of the same layout,
found through the HITOBAN_SHARED environment variable (a folder holding corpus/) or a shared/ folder next to the
repository. Without one they run on tests/corpus and the session ends with a line saying so; they never skip or
fail for its absence. The fast tier (-m "not slow") never asks for it, so it reads exactly what a fresh clone has.
"""

from __future__ import annotations

import importlib
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # pytest -n N (pyproject's addopts): N sessions
if WORKERS > 1:  # each worker's torch (and the processes it starts) gets its share of the cores, not all of them:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // WORKERS)))  # idle threads spin

import torch  # noqa: E402  (after OMP_NUM_THREADS, which torch reads once)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# trackio keeps its runs in TRACKIO_DIR (read once, at its import): the tests' runs go to a folder of their own, never
# to the user's ~/.cache/huggingface/trackio
TRACKIO_HOME = __import__("tempfile").mkdtemp(prefix="hitoban-trackio-")  # removed when the session ends
os.environ["TRACKIO_DIR"] = os.path.join(TRACKIO_HOME, "trackio")

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "corpus"  # in the repository: what every test reads unless it asks for more
LARGE = Path(os.environ.get("HITOBAN_SHARED") or REPO.parent / "shared") / "corpus"  # optional, outside the repo
LARGE_CORPUS_NOTES: list[str] = []  # printed at the end of the session


def large_corpus_dir() -> tuple[Path, str]:
    """(the corpus a text-hungry slow test should read, one line saying which one it is and why)."""
    if (LARGE / "literature").is_dir():
        return LARGE, f"larger corpus: {LARGE} (HITOBAN_SHARED or ../shared)"
    return CORPUS, (f"larger corpus: none at {LARGE} (set HITOBAN_SHARED to a folder holding corpus/): the slow "
                    f"tests that want more text ran on the repository's tests/corpus")


def built_once(tmp_path_factory, name: str, build) -> Path:
    """The folder of a session fixture, filled by `build(folder)` once per test run. pytest-xdist's workers are
    sessions of their own: the first to ask builds under a file lock in the run's shared temporary folder and the
    others wait and reuse it (the pattern of xdist's docs), so the demo's minutes are spent once, not per worker."""
    if WORKERS == 1:
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp().parent  # pytest-N/, above every worker's popen-gwK/
    folder, done = root / name, root / f"{name}.built"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():  # a build that failed left no mark: the next worker tries again, and fails the same
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


def network_available() -> bool:
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
        return True
    except OSError:
        return False



def free_port() -> int:
    with socket.socket() as s:  # a fixed port collides with a run still closing (or another test run)
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_hitoban(args: list[str], processes: int, cwd, timeout: int = 600,
                   **extra_env) -> subprocess.CompletedProcess:
    """`hitoban ARGS` in 1 process, or in `processes` CPU processes under torchrun (DDP over gloo)."""
    port = str(free_port())
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "MASTER_PORT": port, **extra_env}
    if processes == 1:
        command = [sys.executable, "-m", "hitoban.cli", *args]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                   "--master_port", port, "-m", "hitoban.cli", *args]
    # its own process group: on a timeout every rank is killed with torchrun, not left running after the test
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)

TRANSFORMERS_MARKERS = ("accelerate_tests", "flash_attn_test", "flash_attn_3_test", "flash_attn_4_test",
                        "torch_compile_test", "torch_export_test", "is_agent_test", "is_expert_parallel_test",
                        "is_fsdp_test", "is_pipeline_test", "is_staging_test", "is_tensor_parallel_test",
                        "is_training_test", "order")


def pytest_configure(config):
    """The markers transformers' own test files (tests/modeling/test_transformers_common.py) put on their tests."""
    for name in TRANSFORMERS_MARKERS:
        config.addinivalue_line("markers", f"{name}: used by transformers' common model tests")


def pytest_unconfigure(config):
    shutil.rmtree(TRACKIO_HOME, ignore_errors=True)


def pytest_report_header(config):
    return [f"test corpus: {CORPUS}", large_corpus_dir()[1]]


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # an xdist worker: its notes go to the controller, which prints
        session.config.workeroutput["large_corpus_notes"] = LARGE_CORPUS_NOTES


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller, as each worker ends: the workers' large-corpus notes, printed once at the end."""
    LARGE_CORPUS_NOTES.extend(getattr(node, "workeroutput", {}).get("large_corpus_notes", []))


def pytest_terminal_summary(terminalreporter):
    for note in dict.fromkeys(LARGE_CORPUS_NOTES):  # once, however many workers asked
        terminalreporter.write_line(note)


SLOW_SECONDS = 1  # a slow test that names no `seconds` (many are skipped ones, such as transformers' own): after
# every measured one, before the fast tests


def expected_seconds(item) -> float:
    """What a test is expected to take, for the order only: `@pytest.mark.slow(seconds=N)` (its time in CI's log),
    SLOW_SECONDS for another slow test, nothing for a fast one."""
    mark = item.get_closest_marker("slow")
    return 0.0 if mark is None else float(mark.kwargs.get("seconds", SLOW_SECONDS))


def longest_files_first(items: list) -> None:
    """Files in order of their expected seconds, longest first (each keeps its own order; ties keep theirs), so that
    xdist's workers, handed one file at a time in this order (pyproject's --no-loadscope-reorder: xdist's own order
    is by number of tests, which sent the four-minute federation file, one test, to the end), finish together on
    the many short files instead of one of them waiting out a long file that came last."""
    seconds: dict = {}
    first: dict = {}
    for index, item in enumerate(items):
        seconds[item.path] = seconds.get(item.path, 0.0) + expected_seconds(item)
        first.setdefault(item.path, index)
    items.sort(key=lambda item: (-seconds[item.path], first[item.path]))  # stable: a file keeps its own order


def pytest_collection_modifyitems(config, items):
    """The longest files first (longest_files_first). Tests marked `network` need the Hugging Face Hub; they skip
    cleanly on offline machines (and in CI)."""
    longest_files_first(items)
    if any("network" in item.keywords for item in items) and not network_available():
        skip = pytest.mark.skip(reason="needs network access to huggingface.co (offline here)")
        for item in items:
            if "network" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="module")
def benchmark():
    """`benchmark("bench_lr")` is benchmarks/bench_lr.py as a module, imported by name as the scripts import each other
    (bench_wd imports run_lengths, which imports bench_lr): benchmarks/ is on sys.path for one test module at a time.
    Module-scoped: hypothesis reruns a test, not its fixtures."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(REPO / "benchmarks"))
        yield importlib.import_module


def committed_sweep(bench, folder: Path) -> dict:
    """A sweep that a run_lengths script (`bench`: bench_wd, bench_warmup or bench_batch, from the `benchmark`
    fixture) committed under benchmarks/results/: its table reprints as committed (the page's table is that report),
    and every length read its training text less than once (the night's regime). Returns the saved sweep."""
    import json

    from bench_lr import BATCH, CONTEXT  # benchmarks/ is on sys.path while the `benchmark` fixture is

    saved = json.loads((folder / f"{bench.__name__}.json").read_text())
    assert bench.report(saved) == (folder / f"{bench.__name__}.md").read_text().splitlines()
    assert max(r["steps"] * BATCH * CONTEXT for r in saved["rows"]) < saved["train_tokens"]
    return saved


def pretrain_help() -> str:
    """`hitoban pretrain --help` on one line (argparse's wrapping undone), for tests of what its defaults cite."""
    from hitoban.cli import build_parser
    from hitoban.verbs.reference import verbs

    return " ".join(dict(verbs(build_parser()))["hitoban pretrain"].format_help().split())


@pytest.fixture(scope="session")
def corpus() -> Path:
    if not (CORPUS / "literature").is_dir():
        pytest.fail(f"the repository's test corpus is missing at {CORPUS} (an incomplete checkout?)")
    return CORPUS


@pytest.fixture(scope="session")
def large_corpus(corpus) -> Path:
    """More text for a slow test where a larger corpus is present; tests/corpus otherwise (said at the end)."""
    path, note = large_corpus_dir()
    LARGE_CORPUS_NOTES.append(note)
    return path


@pytest.fixture(scope="session")
def literature_texts(corpus) -> list[str]:
    files = sorted((corpus / "literature").glob("0*.txt"))
    return [f.read_text(encoding="utf-8") for f in files]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, literature_texts) -> Path:
    """A 4,000-piece tokenizer trained on ~1M chars of real literature (about 10 s)."""
    from hitoban.training.data.tokenizer import train_tokenizer_from_texts

    return built_once(tmp_path_factory, "tok", lambda folder: train_tokenizer_from_texts(
        literature_texts[:40], folder / "tokenizer", vocab_size=4000, max_chars=1_000_000, model_max_length=256)
    ) / "tokenizer"


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture
def tiny_model():
    from hitoban import HitobanConfig, HitobanForCausalLM

    torch.manual_seed(0)
    return HitobanForCausalLM(HitobanConfig.from_preset("tiny", vocab_size=2000)).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer_dir):
    """A saved tiny model + tokenizer folder (random weights, real tokenizer)."""
    from transformers import AutoTokenizer

    from hitoban import HitobanConfig, HitobanForCausalLM

    def build(folder: Path) -> None:
        torch.manual_seed(0)
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        HitobanForCausalLM(HitobanConfig.from_preset("tiny", vocab_size=len(tok))).save_pretrained(folder / "model")
        tok.save_pretrained(folder / "model")

    return built_once(tmp_path_factory, "tiny", build) / "model"


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory, corpus) -> Path:
    """Real shards: 30 Aozora works (<= 60k chars each), 4,000-piece tokenizer, 3 train shards, val and test."""
    from hitoban.training.data.corpus import build_corpus, local_source
    from hitoban.training.data.filters import FilterSettings
    from hitoban.training.data.shards import build_shards
    from hitoban.training.data.tokenizer import train_tokenizer_from_corpus

    def build(root: Path) -> None:
        works = [str(p) for p in sorted((corpus / "literature").glob("0*.txt"))[:30]]
        build_corpus([local_source(works, name="literature", doc_per_file=True)], root / "corpus",
                     settings=FilterSettings(max_chars=60_000), progress=False)
        train_tokenizer_from_corpus(root / "corpus", root / "tok", vocab_size=4000)
        build_shards(root / "corpus", root / "tok", root / "shards", shard_tokens=80_000, val_every=8, context=64,
                     progress=False)

    return built_once(tmp_path_factory, "shards", build) / "shards"


EXACT = dict(precision="no", compile="off")  # fp32 and eager on every machine: the same bits on both CPU kinds
TINY_NIGHT = dict(preset="tiny", context=64, batch_size=8, log_every=5, eval_every=10, eval_batches=2, progress=False,
                  cpu=True, save_every_min=60, steps=20)


def night_config(data, out, **overrides):
    """The tests' one tiny night: `hitoban pretrain`'s options for a 20-step `tiny` run on the CPU."""
    from hitoban.training.pretrain.options import PretrainConfig

    return PretrainConfig(data=str(data), out=str(out), **{**TINY_NIGHT, **overrides})


@pytest.fixture(scope="session")
def pretrained(tiny_shards, tmp_path_factory) -> Path:
    """A tiny model pretrained for 60 steps on real shards: RUN/final with tokenizer and chat template."""
    from hitoban.training.pretrain.options import PretrainConfig
    from hitoban.training.pretrain.trainer import pretrain

    return built_once(tmp_path_factory, "pre", lambda folder: pretrain(PretrainConfig(
        data=str(tiny_shards), out=str(folder / "run"), preset="tiny", context=128, steps=60, batch_size=8, lr=3e-3,
        eval_every=30, eval_batches=2, log_every=30, progress=False, cpu=True))) / "run" / "final"


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """The demo with `--cpu` where a GPU and a Mac's MPS are both reported present (issue 34: SFT and evaluation
    ran on them anyway). This torch has neither, so any tensor sent to one fails the demo: every stage must run on
    the CPU. Only the reports are patched, and CUDA's RNG state, which the Trainer saves with every checkpoint
    wherever CUDA is reported. Session-wide: the clean-clone secret scan (tests/release) reads its output too."""
    import json

    import torch.cuda.random

    from hitoban.cli import main

    def build(folder: Path) -> None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch.cuda, "is_available", lambda: True)
            patch.setattr(torch.backends.mps, "is_available", lambda: True)
            patch.setattr(torch.cuda.random, "get_rng_state", lambda *_: torch.zeros(0, dtype=torch.uint8))
            patch.setattr(torch.cuda.random, "set_rng_state", lambda *_: None)
            assert main(["demo", "--quick", "--cpu", "--out", str(folder / "night")]) == 0

    out = built_once(tmp_path_factory, "demo", build) / "night"
    return out, json.loads((out / "report.json").read_text(encoding="utf-8"))
