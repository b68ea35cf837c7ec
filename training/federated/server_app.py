"""hitoban's Flower ServerApp: the SuperLink starts it for the run `hitoban federate serve` submits; it holds the run
folder's lock (one server per run, also across a crash and restart) and runs `Server` over Flower's Grid. Its
printed output goes to Flower's log store, so it also writes RUN/server.log, which `serve` shows as it grows."""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from hitoban.training.federated.server import Server
from hitoban.training.pretrain.checkpoint import RunLock

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    run = Path(str(context.run_config["run-dir"]))
    lock = RunLock(run).acquire()
    try:
        with open(run / "server.log", "a", encoding="utf-8") as log:
            def say(line: str) -> None:
                log.write(line + "\n")
                log.flush()

            try:
                Server(run, log=say).serve(grid)
            except BaseException as err:  # said in server.log too, where `serve` reads it
                say(f"error: {type(err).__name__}: {err}")
                raise
    finally:
        lock.release()
