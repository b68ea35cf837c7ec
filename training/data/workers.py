"""Data preparation on every core: the per-document filters (`filters.examine`: cleaning, splitting, language,
repetition, the duplicate keys and MinHash signatures) run in worker processes, in windows of documents read in
order, while the one process that owns the corpus de-duplicates, masks and writes them in that same order. The
output is byte-identical to one process (tests/training/data/test_workers.py), and memory stays bounded by one
window of documents.

Standard library and the filters (themselves light) at import: the corpus verb's options read `default_workers`."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import sys
from collections import deque
from collections.abc import Iterable, Iterator

from hitoban.training.data.filters import examine

WINDOW_PER_WORKER = 64  # documents handed to each worker per window: large enough to amortise the pickling
_SETTINGS = None  # a worker's FilterSettings, set once by its initializer


def default_workers() -> int:
    """Every core this process may use (its CPU affinity where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def _start(settings) -> None:
    global _SETTINGS
    _SETTINGS = settings


def _examine(raw: str):
    return examine(raw, _SETTINGS)


def examined(documents: Iterable[str], settings, workers: int) -> Iterator:
    """`filters.examine` of every document, in the documents' order, on `workers` processes (1: this one). Stops
    reading when the caller stops iterating (a reached character target)."""
    if workers <= 1:
        yield from (examine(raw, settings) for raw in documents)
        return
    documents, size = iter(documents), workers * WINDOW_PER_WORKER
    context = multiprocessing.get_context("fork" if os.name == "posix" and sys.platform != "darwin" else "spawn")
    with context.Pool(workers, initializer=_start, initargs=(settings,)) as pool:
        pending: deque = deque()

        def submit() -> None:  # the next window goes out while this one is being written: two in flight at most
            window = list(itertools.islice(documents, size))
            if window:
                pending.append(pool.map_async(_examine, window, chunksize=max(1, len(window) // (workers * 4))))

        submit()
        submit()
        while pending:
            results = pending.popleft().get()
            submit()
            yield from results


__all__ = ["WINDOW_PER_WORKER", "default_workers", "examined"]
