"""Every input that product code takes from the environment, in one place: the fault and test hooks (issue 36).

No module of modeling/, training/, evaluation/, release/ or hitoban/ reads a `HITOBAN_*` environment variable except
this one (tests/test_hidden_inputs.py reads every file and fails naming the line of any other). A process reads its
hooks once, at the first `active()`, from two variables:

  HITOBAN_FAULTS    a JSON object of the hooks below, e.g. `{"pause_in_save": 1, "inf_loss": [1, 7]}`: what the
                    tests and the kill test set for the subprocesses they launch (`to_env(**hooks)` writes it)
  HITOBAN_CPU_BF16  0/1, the documented alias of `cpu_bf16` (README, benchmarks/bench_optim.py): users and benchmark
                    scripts set it by hand; a `cpu_bf16` named in HITOBAN_FAULTS wins over it

An unknown hook name, a value of the wrong type or anything but a JSON object is refused at the first `active()`
with an error that names the variable, the hook and the known hooks: a misspelt hook never silently does nothing.
In-process tests use `scoped(**hooks)` (a context manager, over the environment's hooks) instead of the environment.

The hooks (all off by default; none changes a result except where it says so):

  pause_in_save          seconds (float). training/pretrain/checkpoint.py: `save_checkpoint` writes RUN/SAVING and
                         sleeps this long after the weights and before COMPLETE, so the kill test
                         (training/pretrain/killtest.py) can land a SIGKILL inside a save.
  state_digest_dir       folder (str). training/pretrain/checkpoint.py: before each save, a digest of the state *in
                         memory* goes to DIR/step-N.json: the kill test's check [A] compares it with a fresh reload.
  deterministic          bool. training/pretrain/trainer.py: on CUDA, deterministic kernels (cuBLAS workspace,
                         `torch.use_deterministic_algorithms`) so a killed and resumed run is bit-identical; the kill
                         test asks for it in every run it launches.
  clock_skew             [rank, seconds]. training/pretrain/trainer.py (`clock_skew(rank)`): that rank's clock runs
                         `seconds` ahead, for the test that the time-based save/stop decision is shared by all ranks.
  inf_loss               [rank, step]. training/pretrain/trainer.py (`planted_inf_step(rank)`): that rank's loss at
                         that step is made infinite: the monitor's divergence stop must act on every rank.
  federated_step_pause   seconds (float). training/federated/inner.py: sleep this long after each inner step (a slow
                         machine, for the lease and task-queue tests).
  federated_nan_delta    bool. training/federated/client_app.py: this machine sends a NaN delta on purpose (the
                         negative control of the server's finite-delta check).
  cpu_bf16               bool or null. training/hardware.py (`device_facts`): decide as on a CPU with (true) or
                         without (false) native bf16 instead of asking the CPU (benchmarks, tests); null: ask it.

Standard library only: the console script's light verbs may import it without torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

ENV = "HITOBAN_FAULTS"
CPU_BF16_ENV = "HITOBAN_CPU_BF16"  # the documented alias of the cpu_bf16 hook: "0" or "1"


class FaultsError(ValueError):
    """A hook that cannot be read: unknown, of the wrong type, or HITOBAN_FAULTS that is not a JSON object."""


@dataclass(frozen=True)
class Faults:
    """The hooks of one process (see the module docstring for who reads each one and why)."""

    pause_in_save: float = 0.0
    state_digest_dir: str | None = None
    deterministic: bool = False
    clock_skew: tuple[int, float] | None = None
    inf_loss: tuple[int, int] | None = None
    federated_step_pause: float = 0.0
    federated_nan_delta: bool = False
    cpu_bf16: bool | None = None

    def __post_init__(self):
        for hook in HOOKS:
            object.__setattr__(self, hook, _check(hook, getattr(self, hook)))

    def named(self) -> dict:
        """The hooks that differ from their default, JSON-ready (what `to_env` writes)."""
        return {hook: list(value) if isinstance(value, tuple) else value
                for hook, value in dataclasses.asdict(self).items() if value != _DEFAULTS[hook]}


HOOKS = tuple(f.name for f in dataclasses.fields(Faults))
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Faults)}


def _check(hook: str, value):
    """`value` as the hook's type (JSON lists become tuples), or FaultsError naming the hook and what it takes."""
    def refuse(takes: str):
        raise FaultsError(f"fault hook {hook}={value!r}: it takes {takes}")

    if hook in ("pause_in_save", "federated_step_pause"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            refuse("seconds, a number >= 0")
        return float(value)
    if hook in ("deterministic", "federated_nan_delta"):
        if not isinstance(value, bool):
            refuse("true or false")
        return value
    if hook == "cpu_bf16":
        if value is not None and not isinstance(value, bool):
            refuse("true, false or null")
        return value
    if hook == "state_digest_dir":
        if value is not None and not isinstance(value, (str, os.PathLike)):
            refuse("a folder path")
        return None if value is None else os.fspath(value)
    # clock_skew [rank, seconds], inf_loss [rank, step]
    if value is None:
        return None
    second = "seconds" if hook == "clock_skew" else "step"
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
            or value[0] != int(value[0]) or (hook == "inf_loss" and value[1] != int(value[1]))):
        refuse(f"[rank, {second}] (rank an integer, {second} a number)" if hook == "clock_skew"
               else "[rank, step] (two integers)")
    return (int(value[0]), float(value[1]) if hook == "clock_skew" else int(value[1]))


def _refuse_unknown(names, where: str) -> None:
    unknown = sorted(set(names) - set(HOOKS))
    if unknown:
        raise FaultsError(f"{where}: unknown fault hook{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                          f"the known hooks are {', '.join(HOOKS)} (training/faults.py)")


def make(**hooks) -> Faults:
    """A Faults of the named hooks (the others off); an unknown name is refused."""
    _refuse_unknown(hooks, "make()")
    return Faults(**hooks)


def parse(environ: Mapping[str, str]) -> Faults:
    """The hooks that `environ` (an environment's mapping) sets: HITOBAN_FAULTS, then the HITOBAN_CPU_BF16 alias."""
    hooks: dict = {}
    text = environ.get(ENV, "").strip()
    if text:
        try:
            hooks = json.loads(text)
        except json.JSONDecodeError as err:
            raise FaultsError(f"{ENV}={text!r} is not JSON ({err.msg}); it takes an object such as "
                              '{"pause_in_save": 1}') from None
        if not isinstance(hooks, dict):
            raise FaultsError(f"{ENV}={text!r}: it takes a JSON object of hooks such as " '{"pause_in_save": 1}')
        _refuse_unknown(hooks, ENV)
    alias = environ.get(CPU_BF16_ENV, "").strip()
    if alias and "cpu_bf16" not in hooks:
        if alias not in ("0", "1"):
            raise FaultsError(f"{CPU_BF16_ENV}={alias!r}: it takes 0 (a CPU without native bf16) or 1 (with)")
        hooks["cpu_bf16"] = alias == "1"
    try:
        return Faults(**hooks)
    except FaultsError as err:
        raise FaultsError(f"{ENV}: {err}") from None


@functools.cache
def _from_environment() -> Faults:
    return parse(os.environ)


_SCOPED: list[Faults] = []  # innermost last: scoped() blocks in this process


def active() -> Faults:
    """This process's hooks: the innermost `scoped()` block's, else the environment's, read once (cached)."""
    return _SCOPED[-1] if _SCOPED else _from_environment()


@contextlib.contextmanager
def scoped(**hooks) -> Iterator[Faults]:
    """In-process tests: the named hooks set (over the ones active now) inside the block, in every thread of this
    process. Subprocesses do not see them: launch those with `to_env`."""
    _refuse_unknown(hooks, "scoped()")
    faults = dataclasses.replace(active(), **hooks)
    _SCOPED.append(faults)
    try:
        yield faults
    finally:
        _SCOPED.remove(faults)


def to_env(**hooks) -> dict[str, str]:
    """{HITOBAN_FAULTS: ...} setting the named hooks in a subprocess (merge it into the child's environment; it
    replaces any HITOBAN_FAULTS there). `parse(to_env(**hooks)) == make(**hooks)`."""
    return {ENV: json.dumps(make(**hooks).named(), sort_keys=True)}


def clock_skew(rank: int) -> float:
    """Seconds added to `rank`'s clock (the clock_skew hook), 0.0 for the other ranks and without the hook."""
    skew = active().clock_skew
    return skew[1] if skew is not None and skew[0] == rank else 0.0


def planted_inf_step(rank: int) -> int | None:
    """The step at which the inf_loss hook makes `rank`'s loss infinite, if it does (read once per run)."""
    planted = active().inf_loss
    return planted[1] if planted is not None and planted[0] == rank else None


__all__ = ["CPU_BF16_ENV", "ENV", "HOOKS", "Faults", "FaultsError", "active", "clock_skew", "make", "parse",
           "planted_inf_step", "scoped", "to_env"]
