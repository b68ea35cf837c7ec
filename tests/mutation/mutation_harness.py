"""The mutation harness (issue 35, item 5): damage one member file of one artefact in one fixed way, run one verb
that reads it, and judge the answer.

A case passes when the verb ends in a correct result (exit 0) or a named refusal (exit 2, or a gate's exit 1, with
one `hitoban VERB: error:` line and no traceback), within its time, changing nothing outside its `--out`, and a gate
never exits 0 on a damaged file it certifies. Every case has an id, `VERB|ARTEFACT/MEMBER|MUTATION`, and its own
random generator seeded from that id, so any case reruns alone and the same.

Verbs run in this process (hitoban.cli.main with argv): a fresh interpreter per case would cost seconds each. A
watchdog thread stands in for a subprocess's timeout: past the limit it opens every FIFO of the case for reading and
writing and closes it again, which wakes a verb blocked on one, and the case is judged a hang.
"""

from __future__ import annotations

import _thread
import contextlib
import fnmatch
import hashlib
import io
import os
import random
import shutil
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hitoban.cli import main

TEXT_SUFFIXES = (".json", ".jsonl", ".txt", ".md", ".jinja", ".py")
GARBAGE_LINE = b'{"type": "train", "step": 9'  # a log line cut by a crash: no closing brace, no newline
CONTROL_SUFFIX = "\x1b[2J\x07\n"  # clears a terminal, rings, and breaks a line if printed raw


# ------------------------------------------------------------------------------------------------------- mutations
@dataclass(frozen=True)
class Mutation:
    """One way to damage a member file; `apply` returns whether the file's bytes under its own name changed."""

    name: str
    applies: Callable[[Path], bool]
    apply: Callable[[Path, random.Random, Path], bool]


def _any(path: Path) -> bool:
    return True


def _nonempty(path: Path) -> bool:
    return path.stat().st_size > 0


def _text(path: Path) -> bool:
    return path.name.endswith(TEXT_SUFFIXES) or path.name in ("CURRENT", "LOCK", "COMPLETE")


def _json(path: Path) -> bool:
    return path.suffix == ".json"


def _jsonl(path: Path) -> bool:
    return path.suffix == ".jsonl"


def _replace_bytes(path: Path, data: bytes) -> bool:
    old = path.read_bytes()
    path.write_bytes(data)
    return data != old


def _delete(path: Path, rng: random.Random, outside: Path) -> bool:
    path.unlink()
    return True


def _empty(path: Path, rng: random.Random, outside: Path) -> bool:
    return _replace_bytes(path, b"")


def _truncate(path: Path, rng: random.Random, outside: Path) -> bool:
    data = path.read_bytes()
    return _replace_bytes(path, data[: rng.randrange(1, len(data))] if len(data) > 1 else b"")


def _zero_block(path: Path, rng: random.Random, outside: Path) -> bool:
    data = bytearray(path.read_bytes())
    size = min(len(data), 4096)
    start = rng.randrange(0, len(data) - size + 1)
    data[start : start + size] = bytes(size)
    return _replace_bytes(path, bytes(data))


def _append_garbage(path: Path, rng: random.Random, outside: Path) -> bool:
    return _replace_bytes(path, path.read_bytes() + bytes(rng.randrange(256) for _ in range(64)))


def _invalid_utf8(path: Path, rng: random.Random, outside: Path) -> bool:
    data = path.read_bytes()
    at = rng.randrange(0, len(data) + 1)
    return _replace_bytes(path, data[:at] + b"\xff\xfe\xc3\x28" + data[at:])


def _invalid_json(path: Path, rng: random.Random, outside: Path) -> bool:
    data = path.read_bytes()
    return _replace_bytes(path, data.replace(b":", b"=", 1) if b":" in data else data + b"{")


def _json_wrong_shape(path: Path, rng: random.Random, outside: Path) -> bool:
    return _replace_bytes(path, b'["valid JSON", "of the wrong shape"]\n')


def _half_written_line(path: Path, rng: random.Random, outside: Path) -> bool:
    return _replace_bytes(path, path.read_bytes() + GARBAGE_LINE)


def _symlink_inside(path: Path, rng: random.Random, outside: Path) -> bool:
    siblings = sorted(p for p in path.parent.iterdir() if p != path and p.is_file() and not p.is_symlink())
    target = siblings[0] if siblings else path.parent
    path.unlink()
    path.symlink_to(os.path.relpath(target, path.parent))
    return True


def _symlink_outside(path: Path, rng: random.Random, outside: Path) -> bool:
    """The same bytes, but from a file outside the folder: a reader may use it, a publisher must not ship it."""
    target = outside / f"outside-{rng.randrange(10**9)}-{path.name}"
    shutil.copyfile(path, target)
    path.unlink()
    path.symlink_to(target)
    return False


def _control_name(path: Path, rng: random.Random, outside: Path) -> bool:
    path.rename(path.with_name(path.name + CONTROL_SUFFIX))
    return True


def _folder_for_file(path: Path, rng: random.Random, outside: Path) -> bool:
    path.unlink()
    path.mkdir()
    return True


def _fifo(path: Path, rng: random.Random, outside: Path) -> bool:
    path.unlink()
    os.mkfifo(path)
    return True


MUTATIONS = [
    Mutation("delete", _any, _delete),
    Mutation("empty", _nonempty, _empty),
    Mutation("truncate", lambda p: p.stat().st_size > 1, _truncate),
    Mutation("zero-block", _nonempty, _zero_block),
    Mutation("append-garbage", _any, _append_garbage),
    Mutation("invalid-utf8", _text, _invalid_utf8),
    Mutation("invalid-json", _json, _invalid_json),
    Mutation("json-wrong-shape", _json, _json_wrong_shape),
    Mutation("half-written-line", _jsonl, _half_written_line),
    Mutation("symlink-inside", _any, _symlink_inside),
    Mutation("symlink-outside", _any, _symlink_outside),
    Mutation("control-chars-in-name", _any, _control_name),
    Mutation("folder-for-file", _any, _folder_for_file),
    Mutation("fifo", _any, _fifo),
]
MUTATION_BY_NAME = {m.name: m for m in MUTATIONS}


# ----------------------------------------------------------------------------------------------------------- verbs
@dataclass(frozen=True)
class Verb:
    """A verb reading one artefact kind. `argv(mutated artefact, out folder, pristine artefacts)`; `certifies`: globs
    of the members a gate vouches for (exit 0 on a changed one is a false pass); `ships_links`: a link leaving the
    folder is itself what the gate must refuse; `writes_input`: the verb's --out is the artefact it reads."""

    name: str
    reads: str
    argv: Callable[[Path, Path, dict[str, Path]], list[str]]
    certifies: tuple[str, ...] = ()
    ships_links: bool = False
    writes_input: bool = False
    stdin: str = ""
    members: tuple[str, ...] = ("*",)  # globs of the artefact's members this verb is run on


@dataclass(frozen=True)
class Case:
    verb: Verb
    artefact: str
    member: str
    mutation: Mutation

    @property
    def id(self) -> str:
        return f"{self.verb.name}|{self.artefact}/{self.member}|{self.mutation.name}"


def members(folder: Path, skip: tuple[str, ...] = ()) -> list[str]:
    """Every regular file under `folder`, relative, sorted; `skip` globs leave out what another artefact covers."""
    found = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]
    return sorted(m for m in found if not any(fnmatch.fnmatch(m, g) for g in skip))


def all_cases(verbs: list[Verb], artefacts: dict[str, Path], skips: dict[str, tuple[str, ...]]) -> list[Case]:
    """The full product: every verb x every member of what it reads x every mutation that applies to that member."""
    cases = []
    for verb in verbs:
        root = artefacts[verb.reads]
        for member in members(root, skips.get(verb.reads, ())):
            if not any(fnmatch.fnmatch(member, g) for g in verb.members):
                continue
            cases += [Case(verb, verb.reads, member, m) for m in MUTATIONS if m.applies(root / member)]
    return cases


# ------------------------------------------------------------------------------------------------------ judging
def snapshot(*roots: Path, skip: tuple[Path, ...] = ()) -> dict[str, str]:
    """A fingerprint of every entry under `roots` (files by sha256, links by target, FIFOs and folders by kind),
    never opening a FIFO; entries under `skip` (the verb's own --out) are left out."""
    found = {}
    for root in roots:
        for path in [root, *sorted(root.rglob("*"))] if root.is_dir() else [root]:
            if any(path == s or s in path.parents for s in skip):
                continue
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                found[str(path)] = "link:" + os.readlink(path)
            elif stat.S_ISREG(mode):
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                found[str(path)] = "fifo" if stat.S_ISFIFO(mode) else "folder"
    return found


class Watchdog:
    """Watches the verb's thread from the side: blocked on a FIFO (the kernel's wait channel says so) it is a hang,
    and every FIFO of the case is opened and closed to wake it; past `limit` seconds for any reason it is a hang
    too, and the verb is interrupted."""

    FIFO_WAITS = ("wait_for_partner", "pipe_read", "pipe_write", "pipe_wait", "fifo")

    def __init__(self, root: Path, limit: float):
        self.root, self.limit, self.fired = root, limit, False
        self.done = threading.Event()
        self.channel = Path(f"/proc/self/task/{threading.get_native_id()}/wchan")
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()

    def _blocked_on_fifo(self) -> bool:
        try:
            return any(w in self.channel.read_text() for w in self.FIFO_WAITS)
        except OSError:
            return False

    def _watch(self) -> None:
        started, interrupted = time.monotonic(), False
        while not self.done.wait(0.25):
            if self._blocked_on_fifo():
                self.fired = True
                self._wake_fifos()
            elif time.monotonic() - started > self.limit and not interrupted:
                self.fired = interrupted = True
                _thread.interrupt_main()

    def _wake_fifos(self) -> None:
        for path in self.root.rglob("*"):
            if stat.S_ISFIFO(path.lstat().st_mode):
                with contextlib.suppress(OSError):
                    os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))


@dataclass
class Answer:
    code: int | str  # the exit code, or "traceback: TYPE: message"
    out: str
    err: str
    seconds: float
    hung: bool = False


def run_verb(argv: list[str], root: Path, stdin: str = "", limit: float = 120.0) -> Answer:
    """`hitoban ARGV` in this process, output captured, under the FIFO watchdog."""
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    saved_stdin, sys.stdin = sys.stdin, io.StringIO(stdin)
    try:
        with Watchdog(root, limit) as dog, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code: int | str = main(argv)
            except SystemExit as exit_:  # argparse's own one-line errors
                code = exit_.code if isinstance(exit_.code, int) else 2
            except Exception as error:  # noqa: BLE001 - the judge reports it
                code = f"traceback: {type(error).__name__}: {str(error)[:300]}"
    finally:
        sys.stdin = saved_stdin
    return Answer(code, out.getvalue(), err.getvalue(), time.monotonic() - started, dog.fired)


def error_lines(err: str, code: int) -> list[str]:
    """The verb's own closing lines on stderr: `hitoban VERB: error: ...` (a gate's refusal may word it its way)."""
    return [line for line in err.splitlines() if line.startswith("hitoban ") and (": error:" in line or code == 1)]


def certified(verb: Verb, member: str) -> bool:
    return any(fnmatch.fnmatch(member, g) for g in verb.certifies)


def judge(case: Case, answer: Answer, changed: bool, outside_changes: list[str]) -> list[str]:
    """Everything wrong with how the verb answered this case (empty: a correct result or a named refusal)."""
    problems = []
    if answer.hung:
        problems.append(f"hang: blocked on a FIFO, or past the watchdog's limit ({answer.seconds:.0f} s)")
    if isinstance(answer.code, str):
        problems.append(answer.code)
    elif answer.code == 0:
        if "Traceback" in answer.err:
            problems.append("exit 0 with a traceback on stderr")
        if case.verb.certifies and changed and certified(case.verb, case.member):
            problems.append(f"false pass: the gate exited 0 on a changed {case.member}")
        if case.verb.ships_links and case.mutation.name == "symlink-outside":
            problems.append("false pass: the gate exited 0 with a link leaving the folder")
    elif answer.code in (1, 2) and (answer.code == 2 or case.verb.certifies):
        lines = error_lines(answer.err, answer.code)
        if len(lines) != 1 or "Traceback" in answer.err:
            problems.append(f"exit {answer.code} without exactly one error line: {answer.err[-400:]!r}")
        elif any(ord(c) < 32 and c != "\t" for c in lines[0]):
            problems.append(f"control characters printed raw in the error line: {lines[0][:200]!r}")
    elif answer.code == 4 and "NOT MEASURED" in answer.out + answer.err and "Traceback" not in answer.err:
        pass  # a measuring verb that says it measured nothing (ExitCode.NOT_MEASURED): a named refusal, not a pass
    else:
        problems.append(f"exit {answer.code}: {(answer.err or answer.out)[-300:]!r}")
    if outside_changes:
        problems.append(f"changed outside --out: {outside_changes[:3]}")
    return problems


@dataclass
class Outcome:
    case: Case
    problems: list[str]
    answer: Answer


@dataclass
class Harness:
    """Copies, mutates, runs and judges cases against pristine `artefacts`, in folders under `scratch`."""

    artefacts: dict[str, Path]
    scratch: Path
    seed: int = 35
    limit: float = 120.0
    outcomes: list[Outcome] = field(default_factory=list)

    def rng(self, case: Case) -> random.Random:
        return random.Random(f"{self.seed}|{case.id}")

    def run(self, case: Case) -> Outcome:
        root = self.scratch / f"case-{len(self.outcomes):04d}"
        (root / "outside").mkdir(parents=True)
        mutated, out = root / "in" / case.artefact, root / "out"
        shutil.copytree(self.artefacts[case.artefact], mutated, symlinks=True)
        changed = case.mutation.apply(mutated / case.member, self.rng(case), root / "outside")
        argv = case.verb.argv(mutated, out, self.artefacts)
        watched = [root, *(p for p in self.artefacts.values() if str(p) in argv)]
        skip = (out, mutated) if case.verb.writes_input else (out,)
        before = snapshot(*watched, skip=skip)
        answer = run_verb(argv, root, case.verb.stdin, self.limit)
        after = snapshot(*watched, skip=skip)
        moved = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        outcome = Outcome(case, judge(case, answer, changed, moved), answer)
        self.outcomes.append(outcome)
        shutil.rmtree(root, ignore_errors=True)
        return outcome


def table(outcomes: list[Outcome]) -> str:
    """Cases, passes, refusals, problems and seconds per verb: what the slow test prints at its end."""
    rows: dict[str, list[float]] = {}
    for o in outcomes:
        row = rows.setdefault(o.case.verb.name, [0, 0, 0, 0, 0.0])
        row[0] += 1
        row[1] += o.answer.code == 0 and not o.problems
        row[2] += o.answer.code in (1, 2, 4) and not o.problems
        row[3] += bool(o.problems)
        row[4] += o.answer.seconds
    width = max([len(v) for v in rows] + [4])
    lines = [f"{'verb':<{width}}  {'cases':>5}  {'exit 0':>6}  {'refused':>7}  {'problems':>8}  {'seconds':>7}"]
    lines += [f"{v:<{width}}  {r[0]:>5}  {r[1]:>6}  {r[2]:>7}  {r[3]:>8}  {r[4]:>7.1f}"
              for v, r in sorted(rows.items())]
    total = [sum(r[i] for r in rows.values()) for i in range(5)]
    lines.append(f"{'all':<{width}}  {total[0]:>5}  {total[1]:>6}  {total[2]:>7}  {total[3]:>8}  {total[4]:>7.1f}")
    return "\n".join(lines)
