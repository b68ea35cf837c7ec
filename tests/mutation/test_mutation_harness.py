"""Issue 35, item 5: every mutation of a fixed family, applied to every member file of every artefact of the
README's path, read by every verb that reads it (tests/mutation/mutation_harness.py says what passes).

The fast tier runs a fixed, seeded sample of the cases and the negative controls; the slow tier runs them all and
prints cases per verb. Cases that fail in code other engineers own are listed in KNOWN_FAILURES, strictly: a listed
case that starts passing fails the run until it is taken off the list.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from mutation_artefacts import build_night
from mutation_harness import MUTATION_BY_NAME, Case, Harness, Outcome, all_cases, table
from mutation_verbs import SKIPS, VERBS

FAST_CASES = 36  # a seeded sample of the cheap verbs' cases: the fast tier's share
# a second or more each: slow tier only
EXPENSIVE = ("pretrain", "pretrain --resume auto", "tokenizer", "sft", "tone", "calibrate", "compare")
PER_VERB = 45  # the slow tier's cap per (verb, artefact), a seeded sample: ~600 cases in ~5 min on 2 free cores
PER_EXPENSIVE_VERB = 20

@pytest.fixture(scope="module")  # here, not in a conftest.py of this folder: a second `conftest` module would hide
def night(tmp_path_factory, corpus) -> dict[str, Path]:  # tests/conftest.py from every other test file
    """The README's path built once (about 10 s on 2 cores): corpus, tok, shards, run (with final/), reports,
    release and the small inputs the verbs take; never mutated (each case damages a copy)."""
    return build_night(corpus, tmp_path_factory.mktemp("night"))


# case id -> the file that must change, and why the case fails today. Owned by other engineers (release/*,
# evaluation/leaks.py, evaluation/privacy.py, hitoban/provenance.py, training/pretrain/{checkpoint,resume,trainer}.py).
KNOWN_FAILURES: dict[str, str] = json.loads((Path(__file__).parent / "known_failures.json").read_text(
    encoding="utf-8"))


def run_cases(night: dict[str, Path], scratch: Path, cases: list[Case]) -> list[Outcome]:
    harness = Harness(night, scratch)
    for case in cases:
        harness.run(case)
    return harness.outcomes


def verdict(outcomes: list[Outcome]) -> list[str]:
    """New failures (not known) and known failures that now pass (strict): both fail the test."""
    lines = [f"FAILED {o.case.id!r}: {'; '.join(o.problems)}" for o in outcomes
             if o.problems and o.case.id not in KNOWN_FAILURES]
    lines += [f"XPASS(strict) {o.case.id!r}: fixed; take it off known_failures.json ({KNOWN_FAILURES[o.case.id]})"
              for o in outcomes if not o.problems and o.case.id in KNOWN_FAILURES]
    return lines


def fast_cases(night: dict[str, Path]) -> list[Case]:
    cheap = [c for c in all_cases(VERBS, night, SKIPS) if c.verb.name not in EXPENSIVE]
    return sorted(random.Random(35).sample(cheap, FAST_CASES), key=lambda c: c.id)


def slow_cases(night: dict[str, Path]) -> list[Case]:
    """Every (verb, artefact) pair with at most PER_VERB of its cases (all of them where it has fewer)."""
    groups: dict[tuple[str, str], list[Case]] = {}
    for case in all_cases(VERBS, night, SKIPS):
        groups.setdefault((case.verb.name, case.artefact), []).append(case)
    chosen = []
    for (name, _), cases in sorted(groups.items()):
        cap = PER_EXPENSIVE_VERB if name in EXPENSIVE else PER_VERB
        chosen += cases if len(cases) <= cap else random.Random(f"35|{name}").sample(cases, cap)
    return sorted(chosen, key=lambda c: c.id)


@pytest.mark.slow
def test_every_verb_reads_the_pristine_artefacts(night, tmp_path):
    """The baseline: unmutated, every verb of the harness exits 0 (else its cases would judge nothing)."""
    from mutation_harness import run_verb

    failures = []
    for verb in VERBS:
        root = tmp_path / f"{len(failures)}-{verb.name.replace(' ', '_')}-{verb.reads}"
        copy = root / "in" / verb.reads
        __import__("shutil").copytree(night[verb.reads], copy, symlinks=True)
        answer = run_verb(verb.argv(copy, root / "out", night), root, verb.stdin)
        known = f"{verb.name}|baseline" in KNOWN_FAILURES
        if answer.code != 0 and not known:
            failures.append(f"{verb.name} on {verb.reads}: exit {answer.code}: {(answer.err or answer.out)[-300:]}")
        elif answer.code == 0 and known:
            failures.append(f"XPASS(strict) {verb.name}|baseline: fixed; take it off known_failures.json")
    assert not failures, "\n".join(failures)


def test_fast_subset_of_mutations(night, tmp_path):
    outcomes = run_cases(night, tmp_path, fast_cases(night))
    assert len(outcomes) == FAST_CASES
    problems = verdict(outcomes)
    assert not problems, "\n".join(problems)


@pytest.mark.slow(seconds=100)
@pytest.mark.timeout(1800)
def test_every_mutation_of_every_artefact_by_every_verb(night, tmp_path, capsys):
    cases = slow_cases(night)
    assert len({c.id for c in cases}) == len(cases), "case ids must be unique"
    outcomes = run_cases(night, tmp_path, cases)
    with capsys.disabled():
        print(f"\nmutation harness: {len(outcomes)} cases\n{table(outcomes)}")
    if os.environ.get("HITOBAN_MUTATION_REPORT"):  # every failing case and why, for triage
        Path(os.environ["HITOBAN_MUTATION_REPORT"]).write_text(json.dumps(
            {o.case.id: o.problems for o in outcomes if o.problems}, ensure_ascii=False, indent=1), encoding="utf-8")
    unseen = sorted(set(KNOWN_FAILURES) - {c.id for c in all_cases(VERBS, night, SKIPS)}
                    - {f"{v.name}|baseline" for v in VERBS})
    problems = verdict(outcomes) + [f"known failure {case_id!r} is no case any more" for case_id in unseen]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)


# ----------------------------------------------------------------------------------------------- negative controls
def controlled_cases(night, verb_name: str, member: str, mutations: list[str]) -> list[Case]:
    verb = next(v for v in VERBS if v.name == verb_name)
    return [Case(verb, verb.reads, member, MUTATION_BY_NAME[m]) for m in mutations]


def test_a_gate_that_skips_its_check_is_caught(night, tmp_path, monkeypatch):
    """`shards --verify` with verification planted away: exit 0 on damaged shards is judged a false pass."""
    import hitoban.training.data.shards as shards

    monkeypatch.setattr(shards, "verify_shards", lambda *args, **kwargs: {"shards": 0, "splits": {}})
    cases = controlled_cases(night, "shards --verify", "train_000.bin", ["truncate", "zero-block", "append-garbage"])
    outcomes = run_cases(night, tmp_path, cases)
    assert all(any(p.startswith("false pass") for p in o.problems) for o in outcomes), [o.problems for o in outcomes]


def test_a_reader_that_trusts_its_json_is_caught(night, tmp_path, monkeypatch):
    """`watch` with its heartbeat read by a bare json.loads: the damaged heartbeats end in tracebacks, caught."""
    import hitoban.training.pretrain.watch as watch

    monkeypatch.setattr(watch, "read_heartbeat", lambda path: json.loads(path.read_text()))
    cases = controlled_cases(night, "watch", "heartbeat.json", ["invalid-utf8", "json-wrong-shape", "folder-for-file"])
    outcomes = run_cases(night, tmp_path, cases)
    assert all(any(p.startswith("traceback") for p in o.problems) for o in outcomes), [o.problems for o in outcomes]
