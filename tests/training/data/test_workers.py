"""Data preparation on every core (issue 37): the corpus built by N worker processes is byte-identical to one
process's, duplicates, near-duplicates, split long documents and a character target included."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import pickle
import shutil
import subprocess
import sys
import threading

import hypothesis
import pytest
from hypothesis import strategies as st

from hitoban.training.data.corpus import CorpusInputError, build_corpus, local_source
from hitoban.training.data.filters import FilterSettings
from hitoban.training.data.workers import (
    FIRST_WINDOW_PER_WORKER,
    WINDOW_PER_WORKER,
    Examiners,
    _context,
    default_workers,
    examiners,
    prepare,
    threads_of_this_process,
)

CONTACTS = ("町内会のお知らせです。来週の日曜日に公園の清掃を行います。参加される方は前日までに担当の山田まで"
            "ご連絡ください。連絡先は yamada.taro@kouen-machi.jp または "  # hitoban: allow-secret (fake)
            "090-1234-5678 です。"  # hitoban: allow-secret (fake)
            "雨の場合は翌週に延期します。軍手とごみ袋はこちらで用意します。皆様のご参加をお待ちしております。") * 3


def build(corpus, tmp_path, name: str, workers: int, target: int | None = None) -> tuple[str, dict, list]:
    """The corpus's sha256, its manifest and its masked-value log (each line without its salt and digests, which
    a fresh random salt makes differ between any two builds)."""
    works = sorted((corpus / "literature").glob("0*.txt"))[:40]
    copies = tmp_path / "copies"
    if not copies.exists():  # exact and near duplicates of real works, so the de-duplication's order matters
        copies.mkdir()
        shutil.copy(works[0], copies / "again.txt")
        text = works[1].read_text(encoding="utf-8")
        (copies / "edited.txt").write_text(text[:300] + "。少し書き換えた。" + text[300:], encoding="utf-8")
        for copy in ("contacts.txt", "contacts-again.txt"):  # masked where examined: the duplicate's not counted
            (copies / copy).write_text(CONTACTS, encoding="utf-8")
    web = sorted(str(p) for p in (corpus / "web-or-wiki").glob("*.txt"))
    sources = [local_source([*map(str, works), str(copies)], name="literature", doc_per_file=True),
               local_source(web, name="web")]
    manifest = build_corpus(sources, tmp_path / name, target_chars=target,
                            settings=FilterSettings(max_chars=8_000), progress=False, workers=workers)
    manifest.pop("elapsed_seconds")
    log = [{k: v for k, v in json.loads(line).items() if "salt" not in k and "digest" not in k}
           for line in (tmp_path / name / manifest["pii_masks"]["log"]).read_text(encoding="utf-8").splitlines()]
    return hashlib.sha256((tmp_path / name / "documents.jsonl").read_bytes()).hexdigest(), manifest, log


@pytest.mark.parametrize("target", [None, 300_000])
def test_any_number_of_workers_writes_the_same_corpus(corpus, tmp_path, target):
    one = build(corpus, tmp_path, "one", 1, target)
    for workers in (2, 3):
        assert build(corpus, tmp_path, f"w{workers}", workers, target) == one
    manifest, log = one[1], one[2]
    assert manifest["filters"]["rejected"].get("duplicate") and manifest["filters"]["split_pieces"]
    if not target:  # the notice's e-mail and phone number, three times in the kept copy, never in the duplicate
        assert [entry["kind"] for entry in log if "公園の清掃" in entry["context"]] == ["email", "phone"] * 3
    if target:
        assert 0 < manifest["total_chars"] <= target + 2 * 8_000  # stopped at the shares of the target


def test_examined_keeps_the_order_and_stops_reading_when_asked():
    settings = FilterSettings(min_chars=1, near_dup_threshold=None)
    documents = [f"{'あ' * (i % 7 + 1)}文書{i}。" for i in range(1000)]
    read = []

    def source():
        for document in documents:
            read.append(document)
            yield document

    firsts = []
    with examiners(settings, workers=2) as started:
        for found in started.examined(source()):
            firsts.append(json.loads(found.encoded[0]))
            if len(firsts) == 10:
                break
    assert firsts == documents[:10]
    assert len(read) < len(documents)  # a bounded window was read, not the whole source
    assert json.dumps(default_workers()) and default_workers() >= 1


def test_examined_keeps_every_document_in_order_across_the_window_boundaries():
    """The first window (examined in this process while the workers take the next two) and the workers' windows
    after it lose, double or reorder nothing, whatever the number of documents and wherever the caller stops."""
    settings = FilterSettings(min_chars=1, near_dup_threshold=None)
    edge = 2 * (FIRST_WINDOW_PER_WORKER + 2 * WINDOW_PER_WORKER)  # two workers: the first three windows
    with examiners(settings, workers=2) as started:

        @hypothesis.settings(max_examples=40, deadline=None)
        @hypothesis.given(st.integers(0, edge + 3), st.integers(0, edge + 3), st.integers(0, 10**6))
        def check(count, stop, seed):
            documents = [f"{'あ' * ((i * 7 + seed) % 11 + 6)}文書{i}。" for i in range(count)]  # Japanese enough
            found = [json.loads(f.encoded[0]) for f in itertools.islice(started.examined(documents), stop)]
            assert found == documents[:stop]

        check()


def test_negative_control_results_out_of_order_change_the_corpus(corpus, tmp_path, monkeypatch):
    """If a worker's results were written in the order they finish (not the documents'), the comparison above
    would see it: the same documents, two swapped, give another corpus."""
    one = build(corpus, tmp_path, "one", 1)
    in_order = Examiners.examined

    def swapped(self, documents):
        found = list(in_order(self, documents))
        found[0], found[1] = found[1], found[0]
        yield from found

    monkeypatch.setattr(Examiners, "examined", swapped)
    assert build(corpus, tmp_path, "swapped", 2)[0] != one[0]


def test_the_corpus_verb_forks_its_workers_before_anything_starts_a_thread(tmp_path):
    """The workers start first (once per build, for all its sources), from a process still running one thread, so
    they are forked, the filters and the near-duplicate step already imported. Deciding when the documents arrived,
    after a progress bar had started its monitor, sent the verb to a fork server started late (0.85 s); forking
    before the near-duplicate step's import made each worker import it again. And no build imports scipy (nor
    datasketch, which imports it at module level): half a second of CPU before any worker starts."""
    probe = """
import sys
from concurrent.futures import ProcessPoolExecutor
from hitoban.cli import main
starts = []
real = ProcessPoolExecutor.__init__
def counted(self, *args, mp_context=None, **kwargs):
    starts.append((mp_context.get_start_method(), "hitoban.training.data.near_duplicates" in sys.modules))
    return real(self, *args, mp_context=mp_context, **kwargs)
ProcessPoolExecutor.__init__ = counted
try:
    main(sys.argv[1:])
finally:
    print("POOLS", starts, "HEAVY", sorted({"scipy", "datasketch"} & set(sys.modules)))
"""
    for name in ("a", "b"):
        (tmp_path / f"{name}.txt").write_text(f"{name}: " + "吾輩は猫である。名前はまだ無い。" * 20, encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", probe, "corpus", "--input", str(tmp_path / "a.txt"),
                           str(tmp_path / "b.txt"), "--doc-per-file", "--out", str(tmp_path / "out"), "--workers", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "POOLS [('fork', True)] HEAVY []" in done.stdout



@pytest.mark.parametrize("users", [None, "4"])
def test_the_corpus_verb_leaves_the_blas_setting_as_it_found_it(tmp_path, monkeypatch, users):
    """The verb keeps OpenBLAS single-threaded while it builds (unless the user chose a number: theirs wins) and
    restores the variable after, so a caller's later imports and child processes are not limited by it."""
    from hitoban.cli import main
    from hitoban.training.data.workers import single_threaded_blas

    if users is None:
        monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", users)
    with single_threaded_blas():
        assert os.environ["OPENBLAS_NUM_THREADS"] == (users or "1")
    assert os.environ.get("OPENBLAS_NUM_THREADS") == users
    (tmp_path / "a.txt").write_text(CONTACTS, encoding="utf-8")
    assert main(["corpus", "--input", str(tmp_path / "a.txt"), "--doc-per-file", "--out", str(tmp_path / "out"),
                 "--workers", "2"]) == 0
    assert os.environ.get("OPENBLAS_NUM_THREADS") == users

def test_a_process_running_another_thread_never_forks_its_workers():
    """A fork copies a lock another thread holds, and the child waits on it for ever (a worker hung so in this suite,
    after torch had started its threads): with any other thread running, the workers start from a fork server."""
    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    thread.start()
    try:
        assert threads_of_this_process() >= 2
        assert _context().get_start_method() != "fork"
    finally:
        release.set()
        thread.join()


def test_control_a_single_threaded_process_forks_them():
    """The thread count is what decides: a fresh single-threaded process (Linux) forks, the quick way."""
    probe = ("from hitoban.training.data.workers import _context, threads_of_this_process; "
             "print(threads_of_this_process(), _context().get_start_method())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split() == ["1", "fork"]


TOKENIZER = """
import sys
from hitoban.training.data.tokenizer import train_tokenizer_from_corpus
train_tokenizer_from_corpus(sys.argv[1], sys.argv[2] + "/tok", vocab_size=4000, workers=int(sys.argv[3]))
"""
SHARDS = """
import json, resource, sys
from hitoban.training.data.workers import single_threaded_blas
with single_threaded_blas():  # as the verb imports it: the workers are forked, so they are this process's children
    from hitoban.training.data.shards import build_shards
corpus, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
build_shards(corpus, sys.argv[4], out + "/shards", context=64, val_every=5, progress=False, workers=workers)
children = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"children_cpu": children.ru_utime + children.ru_stime}))
"""


def run_python(script: str, *args) -> str:
    """`script` in a fresh process, with the encoder's parallelism as a user has it (this suite's conftest turns it
    off for its own process)."""
    env = {k: v for k, v in os.environ.items() if k != "TOKENIZERS_PARALLELISM"}
    proc = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def digests(folder) -> dict[str, str]:
    """sha256 of every file under `folder` but the two that record timings (the index's shard list is compared)."""
    found = {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(folder.rglob("*")) if p.is_file()
             and p.name not in ("shards_index.json", "tokenizer_meta.json")}
    index = folder / "shards" / "shards_index.json"
    if index.exists():
        found["index shards"] = json.dumps(json.loads(index.read_text())["shards"], sort_keys=True)
    return found


@pytest.mark.slow
def test_the_tokenizer_and_shards_are_the_same_for_any_number_of_threads(corpus, tmp_path):
    """`hitoban tokenizer --workers` (the encoder's threads, tokenizers' Rust pool) and `shards --workers` (worker
    processes that encode) give byte-identical files for 1 and 2, the tokenizer's SentencePiece model included (its
    trainer's split is fixed). Each run is a fresh process: the encoder's pool is made once per process. The
    control: the shards run with 2 workers did encode in other processes (their CPU time), with 1 in none, so the
    option reached the library (identical files from a setting that never applied would prove nothing)."""
    works = sorted((corpus / "literature").glob("0*.txt"))[:20]
    build_corpus([local_source(list(map(str, works)), name="literature", doc_per_file=True)], tmp_path / "corpus",
                 progress=False, workers=1)
    children, files = {}, {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        run_python(TOKENIZER, tmp_path / "corpus", out, workers)
        shards = run_python(SHARDS, tmp_path / "corpus", out, workers, tmp_path / "w1" / "tok")
        children[workers] = json.loads(shards.strip().splitlines()[-1])["children_cpu"]
        files[workers] = digests(out)
    assert files[1] == files[2] and any(name.endswith(".bin") for name in files[1])
    assert "tok/sentencepiece.model" in files[1]
    assert children[2] > 0 == children[1]


@pytest.mark.parametrize("bad", [0, 2 * FIRST_WINDOW_PER_WORKER, 2 * (FIRST_WINDOW_PER_WORKER + WINDOW_PER_WORKER)])
def test_a_file_that_cannot_be_read_fails_every_build_in_one_line_whichever_process_reads_it(corpus, tmp_path, bad):
    """A whole-file document is read by the process that examines it (`corpus.WholeFile`): this process for the
    first window, a worker for the next, or a later window. Each way the build stops with the one-process error (the
    file and the byte), and leaves no corpus."""
    works = sorted((corpus / "literature").glob("0*.txt"))
    folder = tmp_path / "works"
    folder.mkdir()
    for i in range(bad + 20):  # enough files past the bad one to fill the windows it sits in
        text = works[i % len(works)].read_text(encoding="utf-8") + f"\n写し{i}。"
        (folder / f"{i:04d}.txt").write_bytes(text.encode("utf-8") + (b"\xff\xfe" if i == bad else b""))
    errors = {}
    for workers in (1, 2):
        with pytest.raises(CorpusInputError) as raised:
            build_corpus([local_source([str(folder)], doc_per_file=True)], tmp_path / f"w{workers}",
                         progress=False, workers=workers)
        errors[workers] = str(raised.value)
        assert not (tmp_path / f"w{workers}").exists()
    assert errors[2] == errors[1] and f"{bad:04d}.txt" in errors[1] and "\n" not in errors[1]


def test_a_workers_result_carries_each_text_once(corpus):
    """What crosses from a worker to the writer: each kept piece once (encoded as written), not as examined, masked
    and encoded (a result of a 151,000-character work pickled three copies of it)."""
    text = sorted((corpus / "literature").glob("0*.txt"))[0].read_text(encoding="utf-8")
    for masking in (None, (b"salt" * 4,)):
        found = prepare(text, FilterSettings(max_chars=8_000), masking)
        assert len(found.pieces) > 1  # split: several pieces
        shipped = pickle.dumps(found)
        for piece in map(json.loads, found.encoded):
            assert shipped.count(piece[100:160].encode("utf-8")) == 1


KILLED = """
import os, signal, sys
from hitoban.training.data.workers import single_threaded_blas
with single_threaded_blas():  # as the verbs import them: the workers are forked, and carry the patch below
    from hitoban.training.data import shards, workers
    from hitoban.training.data.corpus import build_corpus, local_source
step, source, out = sys.argv[1:4]
writer = os.getpid()

def killed(real):
    def run(*args):
        run.calls = getattr(run, "calls", 0) + 1
        if os.getpid() != writer and run.calls == (3 if step == "corpus" else 1):  # a worker's 3rd document, 1st chunk
            os.kill(os.getpid(), signal.SIGKILL)  # as the system's out-of-memory killer does
        return real(*args)
    return run

def fails(*args):
    raise RuntimeError("planted: this worker cannot start")

try:
    if step == "start":
        shards._start_encoder = fails
        shards.build_shards(source, sys.argv[4], out, context=64, val_every=5, progress=False, workers=2)
    elif step == "corpus":
        workers.prepare = killed(workers.prepare)
        build_corpus([local_source([source], doc_per_file=True)], out, progress=False, workers=2)
    else:
        shards.DocumentEncoder.__call__ = killed(shards.DocumentEncoder.__call__)
        shards.build_shards(source, sys.argv[4], out, context=64, val_every=5, progress=False, workers=2)
except Exception as error:
    print(type(error).__name__, error)
"""


@pytest.mark.parametrize("step", ["corpus", "shards"])
def test_a_worker_killed_by_the_system_stops_the_build_in_one_line_and_writes_nothing(corpus, tmp_path, step):
    """A worker process the system kills (out of memory, on a night's corpus) must not leave the build waiting for
    its lost work for ever, as multiprocessing's Pool did: the build stops with one line that says what to do, and
    no output folder (nor a temporary one) is left."""
    works = sorted((corpus / "literature").glob("0*.txt"))[:40]
    folder = tmp_path / "works"
    folder.mkdir()
    for work in works:
        (folder / work.name).symlink_to(work.resolve())
    source, extra = folder, []
    if step == "shards":
        from hitoban.training.data.tokenizer import train_tokenizer_from_corpus

        build_corpus([local_source([str(folder)], doc_per_file=True)], tmp_path / "corpus", progress=False, workers=1)
        train_tokenizer_from_corpus(tmp_path / "corpus", tmp_path / "tok", vocab_size=4000)
        source, extra = tmp_path / "corpus", [tmp_path / "tok"]
    done = subprocess.run([sys.executable, "-c", KILLED, step, str(source), str(tmp_path / "out"), *map(str, extra)],
                          capture_output=True, text=True, timeout=120)
    lines = done.stdout.strip().splitlines()
    assert lines == [lines[-1]] and lines[-1].startswith("ResourceError a worker process stopped"), done.stderr[-2000:]
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_workers_that_cannot_start_stop_the_build_in_one_line_and_write_nothing(corpus, tmp_path):
    """A worker's set-up that fails (here planted: the shards' encoder) made multiprocessing's Pool start new workers
    for ever; the build stops in one line, the workers' own error printed above it, nothing written."""
    from hitoban.training.data.tokenizer import train_tokenizer_from_corpus

    works = sorted((corpus / "literature").glob("0*.txt"))[:20]
    build_corpus([local_source(list(map(str, works)), doc_per_file=True)], tmp_path / "corpus", progress=False,
                 workers=1)
    train_tokenizer_from_corpus(tmp_path / "corpus", tmp_path / "tok", vocab_size=4000)
    done = subprocess.run([sys.executable, "-c", KILLED, "start", str(tmp_path / "corpus"), str(tmp_path / "out"),
                           str(tmp_path / "tok")], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines() == ["ResourceError the 2 worker processes could not start (the error "
                                                "above is theirs); run again with --workers 1"], done.stderr[-2000:]
    assert "planted: this worker cannot start" in done.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_a_pool_found_broken_when_the_next_window_is_submitted_is_a_lost_worker_too():
    """The killed worker can be met first when the next window goes out, not when a result is read (the clean-clone
    CI met it so for the shards, under load: a bare BrokenProcessPool): the same one line either way."""
    from concurrent.futures.process import BrokenProcessPool

    from hitoban.errors import ResourceError
    from hitoban.training.data.workers import InOrder

    class Broken:
        def submit(self, *args):
            raise BrokenProcessPool("A child process terminated abruptly")

    with pytest.raises(ResourceError, match="^a worker process stopped"):
        InOrder(Broken(), len, range(10), 4, 2)
