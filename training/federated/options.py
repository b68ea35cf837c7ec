"""`hitoban federate`'s options, defined once (hitoban/options.py): the server's (the night's trajectory, the budget,
DiLoCo's outer step, rounds and leases, the network), a machine's, and the key maker's. Standard library only:
`hitoban --help` builds these parsers without torch or Flower."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from hitoban.options import Checked, check_ranges, option, parse_count, same_as
from hitoban.training.pretrain.options import PretrainConfig, TrainingOptions

DEFAULT_PORT = 9093  # the SuperLink's one HTTP port (Fleet, Control and the ServerApp's API)


@dataclass(kw_only=True)
class ServeOptions(TrainingOptions):
    """`hitoban federate serve`: one model trained by several machines with DiLoCo; the night's trajectory options
    are the inner steps' (every machine trains with them; precision and compile are each machine's own)."""

    # each machine's own (`machine=True`: precision, compile, cpu, memory cap and check, grad-accum): `hitoban
    # federate join` offers them and the server never reads them, so `serve --help` does not show them
    not_offered: ClassVar[tuple[str, ...]] = tuple(f.name for f in fields(TrainingOptions) if f.metadata.get("machine"))

    out: str = option(help="run folder: the server's A/B checkpoints, final/, log.jsonl, heartbeat.json, summary.json")
    tokens: int = option(help="token budget: every token trained exactly once in the final model", parse=parse_count,
                         min=1)
    inner_steps: int = option(500, "inner steps per round on the fastest machine (DiLoCo's H); slower machines get "
                                   "the share their measured tokens/s allows, so the rounds end together", min=1)
    probe_steps: int = option(20, "inner steps of a machine's first task, before its speed is known", min=1)
    outer_lr: float = option(0.7, "DiLoCo's outer learning rate (SGD with Nesterov momentum)", above=0)
    outer_momentum: float = option(0.9, "DiLoCo's outer Nesterov momentum (its buffers are the server's saved "
                                        "outer state); 0 with --outer-lr 1 is plain token-weighted averaging, "
                                        "which measured closer to one machine over a few rounds", min=0, below=1)
    lease_minutes: float = option(60.0, "a round's timeout: a machine that has not answered by then loses its task "
                                        "to the queue", above=0)
    min_machines: int = option(1, "wait for this many machines before a round starts; the lr schedule is a single "
                                  "machine's at the global batch --batch-size x this, fixed when the run starts",
                               min=1)
    wait_minutes: float = option(60.0, "give up when fewer than --min-machines machines are connected this long",
                                 above=0)
    eval_every: int = option(1, "validation of the global model every N rounds (and at the end)", min=1)
    eval_batches: int = option(20, "fixed validation batches per evaluation", min=1)
    resume: str = same_as(PretrainConfig, "resume")
    host: str = option("127.0.0.1", "address the server listens on (0.0.0.0: every interface)")
    port: int = option(DEFAULT_PORT, "the server's port (the SuperLink's HTTP API)", min=1, max=65535)
    keys: str | None = option(None, "a folder from `hitoban federate keys`: TLS with its server certificate, and only "
                                    "the machines whose public keys are in KEYS/nodes/ may join")
    insecure: bool = option(False, "no TLS and no machine authentication: anyone who reaches the port can join and "
                                   "read the model. Loopback and tests only")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_ranges(self)


@dataclass(kw_only=True)
class JoinOptions(Checked):
    """`hitoban federate join`: this machine trains the tasks a server gives it."""

    server: str = option(help="the server's HOST:PORT", positional=True)
    data: str = option(help="this machine's copy of the server's shard folder (checked by sha256 before training)")
    name: str | None = option(None, "this machine's name in the run's records (default: the host name; with --keys, "
                                    "the key's name, which the server checks on every reply)")
    state: str = option("hitoban-machine", "folder for this machine's inner optimizer state and shard digests")
    keys: str | None = option(None, "a folder from `hitoban federate keys` (or its node-NAME part): the CA "
                                    "certificate and this machine's private key")
    insecure: bool = same_as(ServeOptions, "insecure")
    cpu: bool = same_as(TrainingOptions, "cpu")
    precision: str = same_as(TrainingOptions, "precision")
    grad_accum: int = same_as(TrainingOptions, "grad_accum")
    memory_cap_gb: float | None = option(None, "use at most this much memory (GiB): a task whose step needs more is "
                                               "refused before it trains, and the server is told why", above=0)
    wait_minutes: float = option(60.0, "leave (exit 1) when no server has accepted this machine this long after it "
                                       "(re)started dialling", above=0)
    stay: bool = option(False, "keep serving after the run ends (default: leave when the server says it is done)")


@dataclass(kw_only=True)
class KeysOptions(Checked):
    """`hitoban federate keys`: a CA, the server's certificate and a key pair per machine."""

    out: str = option(help="folder for ca.crt, server.crt/.key and node-NAME/ folders")
    machine: list[str] = option(help="a machine's name; repeatable (default: machine-1 machine-2)",
                                factory=lambda: ["machine-1", "machine-2"], repeat=True, metavar="NAME")
    host: list[str] = option(help="a name or IP the server's certificate is valid for; repeatable (default: "
                                  "localhost 127.0.0.1)", factory=lambda: ["localhost", "127.0.0.1"], repeat=True)
    days: int = option(365, "certificates' validity", min=1)
