"""`hitoban federate` for real: Flower's SuperLink and SuperNodes on loopback, TLS and registered keys, the README's
commands as processes. One machine is SIGKILLed mid-task and rejoins, the server is SIGKILLed and started again
with the same command, a machine whose key is not registered is refused; the run still trains every token once
and its final/ loads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the federated extra: pip install 'hitoban[federated]'")

from hitoban.training import faults  # noqa: E402

CTX, BATCH = 64, 8
HITOBAN = [sys.executable, "-m", "hitoban.cli"]


LAUNCHED: list[subprocess.Popen] = []


def launch(args: list[str], log: Path, **env) -> subprocess.Popen:
    """A process in its own group, so a SIGKILL takes its Flower children as a machine crash would."""
    process = subprocess.Popen(HITOBAN + args, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                               env={**os.environ, **env}, start_new_session=True)
    LAUNCHED.append(process)
    return process


def kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


@pytest.fixture(autouse=True)
def no_leftovers():
    """Whatever happens in the test, every process group it started is gone afterwards."""
    yield
    while LAUNCHED:
        kill(LAUNCHED.pop())


def logs(root: Path) -> str:
    """The end of every log the test's processes wrote (theirs, the run's, Flower's), for a failure's message: a
    federation that stalls in CI must say where."""
    paths = sorted(root.glob("*.log")) + sorted(root.glob("run/*.log")) + sorted(root.glob("*/flower/*.log")) \
        + sorted(root.glob("run/flower/*.log"))
    return "\n".join(f"--- {path.relative_to(root)}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-25:])
                     for path in paths)


def wait_for(condition, what: str, root: Path, seconds: float = 240.0):
    deadline = time.time() + seconds
    while time.time() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}\n{logs(root)}")


def exit_code(process: subprocess.Popen, seconds: float) -> int | None:
    try:
        return process.wait(seconds)
    except subprocess.TimeoutExpired:
        return None


def rounds(run: Path) -> list[dict]:
    path = run / "log.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "round"] if path.exists() \
        else []


def started(run: Path, round_: int) -> bool:
    log = run / "server.log"
    return log.exists() and f"round {round_}:" in log.read_text()


@pytest.mark.slow(seconds=230)
@pytest.mark.timeout(600)
def test_a_loopback_federation_survives_a_killed_machine_and_a_killed_server(tiny_shards, tmp_path):
    from hitoban.modeling import HitobanForCausalLM
    from hitoban.training.federated.keys import make_keys
    from hitoban.training.federated.launch import free_port

    keys = tmp_path / "keys"
    make_keys(keys, ["a", "b", "stranger"], ["localhost", "127.0.0.1"])
    (keys / "nodes" / "stranger.pub").unlink()  # its key pair exists, but the server does not know it
    run, port, budget = tmp_path / "run", free_port(), CTX * BATCH * 16
    serve = ["federate", "serve", "--data", str(tiny_shards), "--out", str(run), "--preset", "tiny", "--context",
             str(CTX), "--batch-size", str(BATCH), "--tokens", str(budget), "--inner-steps", "3", "--probe-steps", "2",
             "--eval-batches", "2", "--port", str(port), "--keys", str(keys), "--min-machines", "2",
             "--lease-minutes", "0.5", "--wait-minutes", "4"]  # a machine that gave up fails the run, not a hang

    def join(name: str, **env) -> subprocess.Popen:
        return launch(["federate", "join", f"127.0.0.1:{port}", "--data", str(tiny_shards), "--state",
                       str(tmp_path / name), "--keys", str(keys / f"node-{name}"), "--cpu"], tmp_path / f"{name}.log",
                      **env)

    server = launch(serve, tmp_path / "serve-1.log")
    a = join("a")
    b = join("b", **faults.to_env(federated_step_pause=1.5))  # a slow machine: its tasks take seconds
    stranger = join("stranger")
    assert exit_code(stranger, 180) == 1, logs(tmp_path)
    assert "refused stranger: its public key is not registered" in (tmp_path / "stranger.log").read_text()

    wait_for(lambda: started(run, 2), "round 2", tmp_path)
    time.sleep(2.0)  # b is inside its round-2 task (1.5 s per step)
    kill(b)
    b = join("b")  # the same machine again, with its state folder: it rejoins
    wait_for(lambda: len(rounds(run)) >= 3, "round 3", tmp_path)
    kill(server)
    assert not (run / "summary.json").exists()
    server = launch(serve, tmp_path / "serve-2.log")  # the same command
    assert exit_code(server, 420) == 0, logs(tmp_path)
    for machine in (a, b):
        assert exit_code(machine, 60) == 0, logs(tmp_path)

    summary = json.loads((run / "summary.json").read_text())
    assert summary["tokens_seen"] == summary["token_budget"] == budget
    assert sum(m["windows"] for m in summary["per_machine"].values()) == budget // CTX  # each window once
    assert summary["resumes"] == 1
    assert any(r["why"].startswith("no reply") or "Unavailable" in r["why"] or "unavailable" in r["why"]
               for r in summary["reissued"]), summary["reissued"]  # b's killed task went back to the queue
    assert (tmp_path / "b" / "inner-optimizer.safetensors").exists()
    assert "resumed at round" in (run / "server.log").read_text()
    model = HitobanForCausalLM.from_pretrained(run / "final")
    assert model.num_parameters() > 0
    lineage = json.loads((run / "final" / "lineage.json").read_text())
    assert set(lineage["federated"]["machines"]) <= {"a", "b"} and lineage["rounds"] == summary["rounds"]
    assert sum(m["tokens"] for m in lineage["federated"]["machines"].values()) == budget
