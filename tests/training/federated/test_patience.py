"""A joining machine's patience (training/federated/patience.py), against its definition computed here: a refusal is
believed once a streak of refusals by one server outlasts the patience; an acceptance or the server being seen
unreachable (killed, restarting) starts a new streak; SuperNode exits for other reasons leave after too many in a
row without an acceptance. The CI failure that found it: refusals before a server's restart and by the restarted
server while it registered its machines were added up, the rejoining machine gave up, and the server waited."""

from __future__ import annotations

import socket

from hypothesis import given
from hypothesis import strategies as st

from hitoban.training.federated.patience import Patience, reachable

PATIENCE, MAX_LOSSES = 150.0, 3
EVENTS = st.lists(st.tuples(st.floats(0.5, 60.0), st.sampled_from(["refused", "unreachable", "accepted", "lost"])),
                  max_size=40)


def expected(events: list[tuple[float, str]]) -> list[bool]:
    """Per event, whether the machine gives up there, from the definition."""
    out = []
    for i, (t, kind) in enumerate(events):
        past = events[:i + 1]
        resets = [j for j, (_, k) in enumerate(past) if k in ("accepted", "unreachable")]
        accepts = [j for j, (_, k) in enumerate(past) if k == "accepted"]
        if kind == "refused":  # the streak: refusals since the last acceptance or unreachable server
            first = next(time for time, k in past[(resets[-1] + 1 if resets else 0):] if k == "refused")
            out.append(t - first > PATIENCE)
        elif kind == "lost":  # exits for other reasons since the last acceptance
            out.append(sum(k == "lost" for _, k in past[(accepts[-1] + 1 if accepts else 0):]) > MAX_LOSSES)
        else:
            out.append(False)
    return out


def driven(events: list[tuple[float, str]]) -> list[bool]:
    patience, out = Patience(MAX_LOSSES), []
    for t, kind in events:
        if kind == "accepted":
            patience.accepted()
            out.append(False)
        elif kind == "unreachable":
            patience.unreachable(t)
            out.append(False)
        elif kind == "refused":
            out.append(patience.refused(t, PATIENCE))
        else:
            out.append(patience.lost())
    return out


def timed(gaps: list[tuple[float, str]]) -> list[tuple[float, str]]:
    t, events = 0.0, []
    for gap, kind in gaps:
        t += gap
        events.append((t, kind))
    return events


@given(EVENTS)
def test_patience_follows_its_definition_for_any_sequence_of_events(gaps):
    events = timed(gaps)
    assert driven(events) == expected(events)


def test_refusals_on_both_sides_of_a_server_restart_are_two_streaks():
    """The CI case: refused for 100 s before the restart and 60 s after; neither streak reaches 150 s."""
    before = [(t, "refused") for t in range(0, 101, 5)]
    after = [(t, "refused") for t in range(110, 171, 5)]
    assert not any(driven(before + [(105.0, "unreachable")] + after))
    assert driven(before + after)[-1]  # the control: the same refusals by one server are believed


def test_a_refusal_by_a_server_that_never_went_away_is_believed_after_the_patience():
    patience = Patience(MAX_LOSSES)
    assert not patience.refused(0.0, 30.0) and not patience.refused(29.0, 30.0)
    assert patience.refused(31.0, 30.0)


def test_reachable_tells_a_listening_port_from_a_closed_one():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert reachable(f"127.0.0.1:{port}")
    assert not reachable(f"127.0.0.1:{port}")  # closed now
    assert not reachable("not-an-address")


def test_a_flower_command_that_hangs_is_a_named_failure_not_a_traceback(tmp_path, monkeypatch):
    """`serve` asks the `flwr` CLI for the run's status every 2 s; a hung CLI was a TimeoutExpired traceback."""
    import pytest

    from hitoban.training.federated import launch
    from hitoban.training.federated.options import ServeOptions

    hung = tmp_path / "bin"
    hung.mkdir()
    (hung / "flwr").write_text("#!/bin/sh\nexec sleep 30\n")
    (hung / "flwr").chmod(0o755)
    monkeypatch.setattr(launch, "BIN", hung)
    flower = launch.Flower(tmp_path / "run", ServeOptions(data=str(tmp_path), out=str(tmp_path / "run"), tokens=1,
                                                             insecure=True))
    flower.cli_timeout = 0.5
    with pytest.raises(launch.FlowerFailed, match=r"flwr ls hitoban did not answer in 0.5 s"):
        flower.cli("ls", launch.CONNECTION)


REFUSED_SESSION = """INFO :      Starting Flower SuperNode
ERROR :     Exit Code: 305
Failed to initialize the connection to the SuperLink.
[code: 2004] Failed to activate SuperNode.
"""
LOST_SESSION = """INFO :      Starting Flower SuperNode
INFO :      SuperNode ID: 16532004671739510736
INFO :      Receiving: train message (ID: 189ae2004cbb589e8dab7ef55536a434c73f1017e1ef940ad73daf4bfbe81d80ae)
httpx.HTTPStatusError: Client error '401 Unauthorized' for url 'https://127.0.0.1:46013/v1/fleet/send-node-heartbeat'
INFO :      SuperNode terminated gracefully.
"""


def test_an_exit_is_judged_by_what_that_supernode_wrote(tmp_path):
    """The log is appended across a machine's SuperNodes: a refusal of an earlier one still in the tail (and the
    digits 2004 inside a node or message id) must not make a lost server look like a refused key."""
    from hitoban.training.federated.launch import exit_reason, tail, written_since

    log = tmp_path / "supernode.log"
    log.write_text(REFUSED_SESSION)
    assert exit_reason(written_since(log, 0)) == "refused"
    began = log.stat().st_size
    with open(log, "a") as f:
        f.write(LOST_SESSION)
    assert exit_reason(written_since(log, began)) == "lost"
    assert exit_reason(tail(log, 40)) == "refused"  # the control: what the tail of the whole log said before
    assert exit_reason("ssl.SSLCertVerificationError: [SSL: CERTIFICATE_VERIFY_FAILED]") == "untrusted"
