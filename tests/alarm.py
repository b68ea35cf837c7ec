"""A deadline for one step of a test: a hang fails that test by name, not the whole suite at its global timeout."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def deadline(seconds: float, message: str) -> Iterator[None]:
    """Raise TimeoutError(message) in the main thread after `seconds` (SIGALRM: Linux and macOS). pytest-timeout's
    own alarm, where one is set, is put back with the time it has left (taking it over had cancelled it for the
    rest of the test)."""
    def expire(*_):
        raise TimeoutError(message)

    previous = signal.signal(signal.SIGALRM, expire)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 1e-3))
