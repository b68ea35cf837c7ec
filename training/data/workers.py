"""Data preparation on every core: reading each document that is a whole file, the per-document filters
(`filters.examine`: cleaning, splitting, language, repetition, the duplicate keys and MinHash signatures) and the PII
masking of each piece (`filters.mask_pieces`) run in worker processes, in windows of documents taken in order, while
the one process that owns the corpus de-duplicates and writes them in that same order (and examines the first window
itself, rather than wait for it). The output is byte-identical to one process (tests/training/data/test_workers.py),
and memory stays bounded by a few windows of documents.

Standard library and the filters (themselves light) at import: the corpus verb's options read `default_workers`."""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager

from hitoban.errors import ResourceError
from hitoban.training.data.filters import Examined, encode_pieces, examine, mask_pieces

WINDOW_PER_WORKER = 64  # documents handed to each worker per window: large enough to amortise the pickling
# the chunks each worker takes of a window: each chunk's results cross to the writer in one message, and 4 (16
# documents a chunk) built the literature in 2.12 s against 2.49 s with 16 (4 a chunk), medians of 6 alternating
# rounds; 2 took 2.35 s (larger chunks leave more of the last window to one worker: a guess, not measured)
CHUNKS_PER_WORKER = 4
FIRST_WINDOW_PER_WORKER = 4  # the first window: this process examines it itself while the workers take the next two
_SETTINGS = None  # a worker's FilterSettings and masking, set once by its initializer
_MASKING = None


def default_workers() -> int:
    """Every core this process may use (its CPU affinity where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def encoding_threads(workers: int) -> None:
    """Run tokenizers' Rust encoder (`encode_documents`) on `workers` threads. Its pool reads RAYON_NUM_THREADS once,
    when this process first encodes, so a call after that changes nothing; the tokens are the same for any number
    (tests/training/data/test_workers.py)."""
    os.environ["RAYON_NUM_THREADS"] = str(workers)


def encode_documents(encoder, texts: list[str]) -> list:
    """Each text's encoding by tokenizers' `Tokenizer` `encoder`, for its ids only: `encode_batch_fast` does not
    track the characters each token came from, which no caller here reads (the shards, the tokenizer's characters
    per token). The same ids (tests/training/data/test_shards.py) in about 0.6x the time: the literature's 7.2M
    characters in 2.9 s against 4.7 s on one thread, 1.6 s against 2.5 s on two, and 0.01 s against 0.1 s to free
    the encodings after, in the one thread that writes."""
    return encoder.encode_batch_fast(texts, add_special_tokens=False)


def prepare(raw, settings, masking: tuple[bytes | None] | None = None) -> Examined:
    """One document (a text, or a file with `read()`, read here: `corpus.WholeFile`) examined, its pieces masked
    where `masking` is given (a 1-tuple: the masker's salt), and encoded as the corpus will hold them; shipped
    without their texts, which the writer never reads (whichever process examined it, so one process and many
    write from the same fields)."""
    found = examine(raw if isinstance(raw, str) else raw.read(), settings)
    return encode_pieces(found if masking is None else mask_pieces(found, masking[0])).shipped()


def _start(settings, masking) -> None:
    global _SETTINGS, _MASKING
    _SETTINGS, _MASKING = settings, masking


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """While a corpus is built, the BLAS library that numpy loads (OpenBLAS) starts no threads, unless the user set
    their number: the near-duplicate signatures hash and never multiply matrices, and a process with no other thread
    can fork its workers after importing numpy, so they inherit it rather than import it again. A library reads the
    setting once, when it loads; the variable itself is restored after, so nothing loaded or started later (torch's
    BLAS, a child process) inherits it."""
    before = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("OPENBLAS_NUM_THREADS", None)


def _examine(chunk: list) -> list[Examined]:
    return [prepare(raw, _SETTINGS, _MASKING) for raw in chunk]


def threads_of_this_process() -> int | None:
    """How many OS threads this process runs (native ones included: OpenMP's, rayon's), where the OS says (Linux)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def _context():
    """How the workers start. Forked where this process runs no other thread (Linux: counted, native threads
    included): quickest, and nothing can hold a lock at the fork. Otherwise from a fork server (or spawned where
    there is none): a thread of torch, tokenizers or a progress bar may hold a lock at the fork that the child then
    waits on for ever (a worker hung so in the test suite, after torch had run). The fork server imports this
    module once, so each worker starts without re-importing the filters."""
    if threads_of_this_process() == 1:
        return multiprocessing.get_context("fork")
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, "hitoban.training.data.near_duplicates"])  # once, not per worker
    return context


class InOrder:
    """Each of `items` with its result by `pool`'s processes (`processes`), in the items' order: a window of
    `window` items at a time, the next one in flight while the caller reads this one (memory: two windows), split
    in `chunks` chunks, each one task: `function(chunk)` returns the chunk's results, one per item, and they cross
    back in one message (one call per chunk, so an encoder batches them). Made, it has
    submitted its first two windows. A worker that dies (the OS's out-of-memory killer) stops it with a
    ResourceError, where multiprocessing's Pool would wait for its lost task for ever."""

    def __init__(self, pool, function, items: Iterable, window: int, chunks: int):
        self.pool, self.function, self.items, self.window, self.chunks = pool, function, iter(items), window, chunks
        self.pending: deque = deque()
        self._submit()
        self._submit()

    def _submit(self) -> None:
        batch = list(itertools.islice(self.items, self.window))
        if batch:
            size = max(1, len(batch) // self.chunks)
            with _lost_worker():  # the pool may have broken since the last window: submitting says so
                tasks = [self.pool.submit(self.function, batch[i : i + size]) for i in range(0, len(batch), size)]
            self.pending.append((batch, tasks))

    def __iter__(self) -> Iterator[tuple]:
        while self.pending:  # (a caller that stops early leaves at most two windows in flight: they are cancelled)
            batch, tasks = self.pending.popleft()
            with _lost_worker():
                results = [result for task in tasks for result in task.result()]
            self._submit()
            yield from zip(batch, results)


@contextmanager
def _lost_worker() -> Iterator[None]:
    """A worker gone (`BrokenProcessPool`, whether a task's result or a new task's submission meets it first) as
    the one line the user acts on."""
    try:
        yield
    except BrokenProcessPool:
        raise ResourceError("a worker process stopped (the system may have run out of memory and killed it) and "
                            "nothing was written: run again with fewer --workers") from None


class Examiners:
    """A build's worker processes (or none: `workers` 1 examines in this process), started once for all its
    sources by `examiners`."""

    def __init__(self, settings, workers: int, masking: tuple[bytes | None] | None, pool=None):
        self.settings, self.workers, self.masking, self.pool = settings, workers, masking, pool

    def examined(self, documents: Iterable) -> Iterator[Examined]:
        """`prepare` of every document, in the documents' order. Stops reading when the caller stops iterating (a
        reached character target)."""
        if self.pool is None:
            yield from (prepare(raw, self.settings, self.masking) for raw in documents)
            return
        documents, workers = iter(documents), self.workers
        first = list(itertools.islice(documents, workers * FIRST_WINDOW_PER_WORKER))
        ahead = InOrder(self.pool, _examine, documents, workers * WINDOW_PER_WORKER, workers * CHUNKS_PER_WORKER)
        # the first window here, while the workers take the next two: waiting for it instead left this process idle
        # for its longest document (0.16 s at the start of the literature's build, a 151,000-character work)
        yield from (prepare(raw, self.settings, self.masking) for raw in first)
        yield from (result for _, result in ahead)


@contextmanager
def processes(workers: int, initializer, initargs: tuple) -> Iterator[ProcessPoolExecutor]:
    """`workers` processes, each set up by `initializer(*initargs)`, started now as `_context` decides: call it
    first, while this process may still run a single thread, so that they are forked (a few milliseconds, and what
    this process imported they have too) rather than started from a fork server. Leaving, the tasks not started are
    cancelled (a caller that stopped early) and the running ones finished. A worker whose set-up fails stops it in
    one line (the worker prints its own error above it)."""
    pool = ProcessPoolExecutor(workers, mp_context=_context(), initializer=initializer, initargs=initargs)
    try:
        try:
            pool.submit(int).result()  # forked now (all at once where forked), before this process starts a thread
        except BrokenProcessPool:
            raise ResourceError(f"the {workers} worker processes could not start (the error above is theirs); run "
                                "again with --workers 1") from None
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def examiners(settings, workers: int, masking: tuple[bytes | None] | None = None) -> Iterator[Examiners]:
    """Start a build's workers now: call it first, while this process may still run a single thread, so that they
    are forked (a few milliseconds, the filters and the near-duplicate step already imported: one import per build,
    not one per process) rather than started from a fork server that must import them first. Deciding when
    documents arrive instead (after a progress bar had started its monitor thread) sent the corpus verb to a fork
    server it had not started early: the writer waited 0.85 s for it. numpy's import starts OpenBLAS's threads
    unless `single_threaded_blas` ran first (the corpus verb does); with them running the workers start from a fork
    server that imports it once."""
    if workers <= 1:
        yield Examiners(settings, 1, masking)
        return
    if settings.near_dup_threshold:
        import hitoban.training.data.near_duplicates  # noqa: F401
    with processes(workers, _start, (settings, masking)) as pool:
        yield Examiners(settings, workers, masking, pool)


__all__ = ["CHUNKS_PER_WORKER", "WINDOW_PER_WORKER", "Examiners", "InOrder", "default_workers", "encode_documents",
           "encoding_threads", "examiners", "prepare", "processes", "single_threaded_blas", "threads_of_this_process"]
