"""How long a joining machine keeps trying: its streaks of refusals and of lost servers, each counted against one
server as it is now.

Flower's SuperNode exits with code 2004 both when its key is not registered and when the server is not ready for it
(registering its machines just after a start, or still counting this machine's crashed session as online), so a
refusal is only believed after a streak of them lasts `patience` seconds. The streak is one server's word: a server
that became unreachable since the streak began (killed, restarted) starts a new one, and an acceptance ends both
streaks. Without that, refusals by a server before its restart and by its successor while it registers its machines
added up, and a machine that had been waiting for a rejoin gave up on a server that was about to take it."""

from __future__ import annotations

import socket


class Patience:
    """The join loop's two streaks; `now` is the caller's clock (seconds), so tests drive it."""

    def __init__(self, max_losses: int):
        self.max_losses = max_losses
        self.refused_since: float | None = None  # the first refusal of the current streak
        self.unreachable_at: float | None = None  # the last time the server did not answer a connection
        self.losses = 0  # SuperNode exits in a row for other reasons (the server lost, a crash)

    def accepted(self) -> None:
        self.refused_since, self.unreachable_at, self.losses = None, None, 0

    def unreachable(self, now: float) -> None:
        self.unreachable_at = now

    def refused(self, now: float, patience: float) -> bool:
        """A refusal at `now`; True when the streak has lasted longer than `patience` (believe it)."""
        restarted = self.unreachable_at is not None and self.refused_since is not None \
            and self.unreachable_at >= self.refused_since
        if self.refused_since is None or restarted:
            self.refused_since, self.unreachable_at = now, None
        return now - self.refused_since > patience

    def lost(self) -> bool:
        """The SuperNode exited for another reason; True when that happened more than `max_losses` times in a row."""
        self.losses += 1
        return self.losses > self.max_losses

    @property
    def in_refusal_streak(self) -> bool:
        return self.refused_since is not None


def reachable(address: str, timeout: float = 1.0) -> bool:
    """Whether anything accepts a TCP connection at HOST:PORT (the SuperLink's port; no TLS, nothing sent)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False
