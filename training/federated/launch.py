"""`hitoban federate serve` and `join`: Flower's own processes, started, watched and stopped for the user.

serve: a SuperLink (Flower's server: one HTTPS port for the machines, the run's control and the ServerApp), the
machines' public keys registered with it, and one Flower run of hitoban's ServerApp over the run folder; it shows
RUN/server.log as it grows and leaves when the run has finished. join: a SuperNode (Flower's client) that dials out
to the server (home NAT is fine) and runs hitoban's ClientApp for each task; it leaves when the server says the run
is over. Flower is told never to install anything at run time (offline machines), keeps its state under the run's
or the machine's folder (FLWR_HOME), and sends no telemetry. Both are killed with their parent (Linux), so a
SIGKILLed serve restarted with the same command finds its port free and resumes from the last round's checkpoint.

Flower facts relied on (flwr 1.42, read in its source and tried on loopback): the Fleet, Control and ServerApp APIs
share the SuperLink's one HTTP port; SuperNode authentication needs TLS; an unregistered key is refused at
activation (the SuperNode exits); `flwr run --format json` exits 0 even on failure, so its "success" is read.
Lazy imports: the server, the machine's inner loop and the shard readers (torch) load only in the process that runs
them, so `hitoban federate --help` and a joining machine's set-up start without torch."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from hitoban.errors import CheckFailed, HitobanError, ResourceError, UsageError
from hitoban.run_folder import RunFolder
from hitoban.training.federated.options import JoinOptions, ServeOptions
from hitoban.training.federated.patience import Patience, reachable

BIN = Path(sys.executable).parent  # flower-superlink, flower-supernode and flwr live beside this Python
REFUSAL_PATIENCE = 30.0  # seconds a refused key is retried: the server may be registering its machines just then
REJOIN_PATIENCE = 150.0  # ... and for a machine this server accepted before (its old session must time out first)
MAX_REJOINS = 30  # SuperNode exits in a row (not refusals) before a machine leaves; an acceptance resets the count
CONNECTION = "hitoban"  # the `flwr` CLI's name for this run's SuperLink (in FLWR_HOME/config.toml)
APP = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "hitoban-federated"
version = "1.0.0"
description = "hitoban's federated pretraining (DiLoCo); the code is the installed hitoban package"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "hitoban"

[tool.flwr.app.components]
serverapp = "hitoban.training.federated.server_app:app"
clientapp = "hitoban.training.federated.client_app:app"

[tool.flwr.app.config]
run-dir = ""
"""


class FlowerFailed(HitobanError, RuntimeError):
    """A Flower process stopped or refused; the message carries its own words."""

    exit_code = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies (Linux), so no SuperLink outlives a killed serve."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def flower_env(home: Path) -> dict:
    home.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "FLWR_HOME": str(home),
            "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}


def start(command: list[str], log: Path, home: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=flower_env(home),
                                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)


def stop(process: subprocess.Popen | None, wait: float = 10.0) -> None:
    """SIGTERM (a SuperNode then deregisters, a SuperLink stops its executor), SIGKILL if it lingers."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(wait)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def written_since(path: Path, offset: int) -> str:
    """What a log gained after `offset` bytes."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", errors="replace")


def exit_reason(text: str) -> str:
    """Why a SuperNode exited, from what it wrote: "refused" (Flower's 2004: its key is not registered, or not yet, or
    its earlier session still counts as online), "untrusted" (the server's certificate), else "lost"."""
    if "[code: 2004]" in text or "No SuperNode found with the given public key" in text:  # not any "2004": ids
        return "refused"
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return "untrusted"
    return "lost"


def tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


class Follow:
    """What a log file gains from now on (an earlier session's lines are not shown again): each call prints the new
    lines `keep` accepts and returns all of them."""

    def __init__(self, path: Path, show=print, keep=lambda line: True):
        self.path, self.show, self.keep = path, show, keep
        self.offset = path.stat().st_size if path.exists() else 0

    def __call__(self) -> list[str]:
        if not self.path.exists():
            return []
        with open(self.path, encoding="utf-8", errors="replace") as f:
            f.seek(self.offset)
            lines = f.read().splitlines()
            self.offset = f.tell()
        for line in lines:
            if self.keep(line):
                self.show(line)
        return lines


# ------------------------------------------------------------------------------------------------------ serve
class Flower:
    """The server side's Flower processes and the `flwr` CLI pointed at them."""

    cli_timeout = 300.0  # seconds a `flwr` command may take (a hung one is a FlowerFailed, not a traceback)

    def __init__(self, run: Path, options: ServeOptions):
        self.run, self.options, self.folder = run, options, run / "flower"
        self.keys = Path(options.keys).resolve() if options.keys else None  # Flower's config needs absolute paths
        self.address = f"{'127.0.0.1' if options.host in ('0.0.0.0', '::') else options.host}:{options.port}"
        self.superlink: subprocess.Popen | None = None

    def start_superlink(self) -> None:
        options = self.options
        command = [str(BIN / "flower-superlink"), "--host", options.host, "--port", str(options.port),
                   "--disable-runtime-dependency-installation"]
        if self.keys is not None:
            command += ["--ssl-ca-certfile", str(self.keys / "ca.crt"), "--ssl-certfile",
                        str(self.keys / "server.crt"), "--ssl-keyfile", str(self.keys / "server.key"),
                        "--enable-supernode-auth"]
        else:
            command.append("--insecure")
        log = self.folder / "superlink.log"
        self.superlink = start(command, log, self.folder / "home-superlink")
        deadline, context = time.time() + 60, (ssl.create_default_context(cafile=str(self.keys / "ca.crt"))
                                               if self.keys else None)
        scheme = "https" if self.keys else "http"
        while True:
            if self.superlink.poll() is not None:
                raise FlowerFailed(f"Flower's SuperLink stopped at start (port {options.port} in use, or a bad "
                                   f"certificate?):\n{tail(log)}")
            try:
                with urllib.request.urlopen(f"{scheme}://{self.address}/health", timeout=2, context=context) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise FlowerFailed(f"Flower's SuperLink did not answer on {self.address} within a minute:\n"
                                   f"{tail(log)}")
            time.sleep(0.5)
        security = (f'root-certificates = "{self.keys / "ca.crt"}"' if self.keys else "insecure = true")
        (self.folder / "home-cli").mkdir(parents=True, exist_ok=True)
        (self.folder / "home-cli" / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "{self.address}"\n'
            f"{security}\n")

    def cli(self, *args: str) -> dict:
        """`flwr ARGS --format json`; its exit code is 0 even on failure, so "success" decides."""
        try:
            done = subprocess.run([str(BIN / "flwr"), *args, "--format", "json"], capture_output=True, text=True,
                                  env=flower_env(self.folder / "home-cli"), timeout=self.cli_timeout)
        except subprocess.TimeoutExpired:
            raise FlowerFailed(f"flwr {' '.join(args)} did not answer in {self.cli_timeout:g} s (is the SuperLink "
                               f"overloaded?):\n{tail(self.folder / 'superlink.log')}") from None
        try:
            answer = json.loads(done.stdout)
        except json.JSONDecodeError:
            raise FlowerFailed(f"flwr {' '.join(args)} failed:\n{done.stdout}{done.stderr}") from None
        if not answer.get("success"):
            raise FlowerFailed(f"flwr {' '.join(args)} failed: {answer.get('error-message', answer)}")
        return answer

    def register_machines(self) -> list[str]:
        from hitoban.training.federated.keys import node_keys

        names = []
        for public in node_keys(self.keys):
            try:
                self.cli("supernode", "register", str(public), CONNECTION, "--name", public.stem)
            except FlowerFailed as err:
                if "already" not in str(err).lower():  # a restarted server with a kept database
                    raise
            names.append(public.stem)
        return names

    def submit(self) -> str:
        app = self.folder / "app"
        app.mkdir(parents=True, exist_ok=True)
        (app / "pyproject.toml").write_text(APP)
        return str(self.cli("run", str(app), CONNECTION, "--run-config", f"run-dir={json.dumps(str(self.run))}")
                   ["run-id"])

    def status(self, run_id: str) -> dict:
        return self.cli("ls", CONNECTION, "--run-id", run_id)["runs"][0]

    def close(self) -> None:
        stop(self.superlink)


def wait_for_free_folder(run: Path, seconds: float = 90.0) -> None:
    """A ServerApp of a killed serve may still be finishing (Flower stops it seconds after its SuperLink dies):
    wait for the run folder's lock before a new one starts."""
    from hitoban.training.pretrain.checkpoint import RunBusy, RunLock

    deadline = time.time() + seconds
    while True:
        try:
            RunLock(run).acquire().release()
            return
        except RunBusy:
            if time.time() > deadline:
                raise
            time.sleep(1.0)


def serve(options: ServeOptions, show=print) -> dict:
    """Start the server side, run the federated training to the end, stop. Returns summary.json."""
    from hitoban.training.data.shards import verify_shards
    from hitoban.training.federated.server import OPTIONS_FILE, plan_budget
    from hitoban.training.pretrain.checkpoint import set_aside

    if bool(options.keys) == options.insecure:
        raise UsageError("give --keys KEYS (TLS, and only machines whose keys are registered may join) or "
                         "--insecure (no TLS, no authentication: loopback and tests only), not both")
    if options.insecure:
        show("# WARNING: --insecure: no TLS and no machine authentication; anyone who reaches "
             f"{options.host}:{options.port} can join and read the model. Use --keys beyond this machine.")
    run = Path(options.out)
    verify_shards(options.data, full=True)
    from hitoban.training.data.reader import ShardReader

    plan_budget(options, ShardReader(options.data, "train", verify=False))  # verified above; before any process
    if options.resume == "never" and run.exists() and set_aside(run):
        show(f"# --resume never: the earlier run is kept in {run / 'previous-run'} until this one has saved")
    run.mkdir(parents=True, exist_ok=True)
    wait_for_free_folder(run)

    (run / OPTIONS_FILE).write_text(json.dumps(dataclasses.asdict(options), indent=1))
    flower = Flower(run.resolve(), options)  # the ServerApp runs in the SuperLink's folder: absolute paths only
    follow = Follow(run / "server.log", show)
    try:
        flower.start_superlink()
        if flower.keys is not None:
            names = flower.register_machines()
            show(f"# machines allowed to join: {', '.join(names)}")
        run_id = flower.submit()
        show(f"# federated run started on {flower.address} (Flower run {run_id}); machines join with: "
             f"hitoban federate join {flower.address} --data SHARDS" + (" --keys node-NAME" if flower.keys else
                                                                         " --insecure"))
        status = {}
        while True:
            follow()
            status = flower.status(run_id)
            if status["status"].startswith("finished"):
                break
            if flower.superlink.poll() is not None:
                raise FlowerFailed(f"Flower's SuperLink stopped:\n{tail(flower.folder / 'superlink.log')}")
            time.sleep(2.0)
        time.sleep(0.5)
        follow()
        if status["status"] != "finished:completed":
            raise FlowerFailed(f"the federated run ended {status['status']}: {status.get('status-details', '')}\n"
                               f"{tail(run / 'server.log')}\n(run the same command again to resume)")
    except KeyboardInterrupt:
        show("# interrupted: the last round's checkpoint is kept; the same command resumes")
        raise
    finally:
        flower.close()
    summary = RunFolder(run).summary()
    if summary is None:
        raise FlowerFailed(f"the federated run finished without writing {run / 'summary.json'}\n"
                           f"{tail(run / 'server.log')}")
    return summary


# ------------------------------------------------------------------------------------------------------- join
def machine_keys(options: JoinOptions, name: str) -> tuple[Path, Path] | None:
    """(CA certificate, this machine's private key) from --keys: a node-NAME folder or the whole KEYS folder."""
    if not options.keys:
        return None
    keys = Path(options.keys)
    folder = keys if (keys / "node.key").exists() else keys / f"node-{name}"
    if not (folder / "node.key").exists() or not (folder / "ca.crt").exists():
        raise UsageError(f"--keys {keys}: no node.key and ca.crt there (nor in {keys / f'node-{name}'}); copy the "
                         f"node-NAME folder `hitoban federate keys` made for this machine")
    return folder / "ca.crt", folder / "node.key"


def supernode_command(options: JoinOptions, name: str, keys: tuple[Path, Path] | None, state: Path) -> list[str]:
    """Flower's SuperNode for this machine: its node config (what the ClientApp reads: name, data, state, device
    choices, key) and, with keys, TLS and the key it authenticates with."""
    node_config = " ".join(f"{k}={json.dumps(v)}" for k, v in {
        "name": name, "data": str(Path(options.data).resolve()), "state": str(state.resolve()),
        "cpu": options.cpu, "precision": options.precision, "grad-accum": options.grad_accum,
        "memory-cap-gb": options.memory_cap_gb or 0, "key": str(keys[1].resolve()) if keys else ""}.items())
    command = [str(BIN / "flower-supernode"), "--superlink", options.server, "--host", "127.0.0.1", "--port",
               str(free_port()), "--node-config", node_config]
    return command + (["--root-certificates", str(keys[0].resolve()), "--auth-supernode-private-key",
                       str(keys[1].resolve())] if keys else ["--insecure"])


def join(options: JoinOptions, show=print) -> int:
    """This machine trains the server's tasks until the run is over (or Ctrl-C). Returns the exit code."""
    from hitoban.training.data.shards import verify_shards
    from hitoban.training.federated.inner import DONE_FILE, REFUSED_FILE, shard_digests

    if bool(options.keys) == options.insecure:
        raise UsageError("give --keys node-NAME (TLS and this machine's registered key) or --insecure (a server "
                         "started with --insecure), not both")
    name = options.name or socket.gethostname()
    keys = machine_keys(options, name)
    if keys is not None:  # the server knows a machine by its key: the name is the key's, never a second one
        keyed = keys[1].parent.name.removeprefix("node-")
        if options.name and options.name != keyed:
            raise UsageError(f"--name {options.name} but --keys holds {keyed}'s key: the server names a machine by "
                             f"its key; drop --name, or use node-{options.name}/")
        name = keyed
    state = Path(options.state)
    verify_shards(options.data, full=True)  # a damaged copy is named here, before the server is dialled
    shard_digests(Path(options.data), state, verified=True)  # cached: the first task then starts at once
    for word in (DONE_FILE, REFUSED_FILE):  # the server's word from an earlier session
        (state / word).unlink(missing_ok=True)
    command = supernode_command(options, name, keys, state)
    log = state / "flower" / "supernode.log"
    follow = Follow(log, show, keep=lambda line: "hitoban:" in line)

    def start_node() -> tuple[subprocess.Popen, int]:
        """A SuperNode, and where its own lines begin in the (appended) log: an exit is judged by what this
        SuperNode wrote, never by an earlier one's refusal still in the log's tail."""
        offset = log.stat().st_size if log.exists() else 0
        return start(command, log, state / "flower" / "home"), offset

    node, began = start_node()
    show(f"# {name} joining {options.server}; Flower's log: {log}")
    patience, waiting_since = Patience(MAX_REJOINS), time.time()  # waiting: a SuperNode started, not yet accepted
    accepted = state / "flower" / f"accepted-by-{options.server.replace(':', '_').replace('/', '_')}"
    try:
        while True:
            if any("SuperNode ID:" in line for line in follow()):  # accepted (again): every streak ends
                patience.accepted()
                waiting_since = None
                accepted.write_text(options.server + "\n")
            if (state / DONE_FILE).exists() and not options.stay:
                show(f"# the server says the run is over; {name} leaves")
                return 0
            if (state / REFUSED_FILE).exists():
                raise ResourceError(f"the server offers {name} no more tasks: "
                                    f"{(state / REFUSED_FILE).read_text(encoding='utf-8').strip()}")
            if waiting_since is not None and time.time() - waiting_since > options.wait_minutes * 60:
                raise FlowerFailed(f"no server accepted {name} at {options.server} for {options.wait_minutes:g} min "
                                   f"(is `hitoban federate serve` running there, and its port reachable?):\n"
                                   f"{tail(log)}")
            if patience.in_refusal_streak and not reachable(options.server):
                patience.unreachable(time.time())  # a server restarting: its refusals start a new streak
            if node.poll() is not None:
                reason = exit_reason(written_since(log, began))
                if reason == "refused":
                    # Flower says the same when the key is unknown and when this machine's earlier session (before a
                    # crash) still counts as online there, until its heartbeats are missed (about a minute)
                    if patience.refused(time.time(), REJOIN_PATIENCE if accepted.exists() else REFUSAL_PATIENCE):
                        raise CheckFailed(f"the server refused {name}: its public key is not registered there "
                                          "(start the server with --keys holding this machine's nodes/NAME.pub)")
                    time.sleep(3.0)
                    node, began = start_node()
                    continue
                if reason == "untrusted":
                    raise CheckFailed(f"{name} does not trust the server's certificate: --keys must hold the ca.crt "
                                      "of the server's `hitoban federate keys` folder")
                if patience.lost():
                    raise FlowerFailed(f"Flower's SuperNode stopped {patience.losses} times in a row without being "
                                       f"accepted (exit {node.returncode}):\n{tail(log)}")
                show(f"# lost the server (Flower's SuperNode exited {node.returncode}); joining again in 5 s")
                time.sleep(5.0)
                (node, began), waiting_since = start_node(), time.time()
            time.sleep(1.0)
    finally:
        stop(node)
