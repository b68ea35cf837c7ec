"""The secret scan (release/secrets.py): each rule finds its planted secret, near misses pass, the git history is
read, and this source tree is clean."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from release_helpers import HF_TOKEN, PLANTED

from hitoban.provenance import TEST_DATA_MARKER
from hitoban.release import secrets


@pytest.mark.parametrize("rule", sorted(PLANTED))
def test_each_rule_finds_its_secret_and_masks_it(rule):
    findings = secrets.scan_text(PLANTED[rule] + "\n", "f.py")
    assert [f.rule for f in findings] == [rule]
    if rule in ("hf-token", "openai-key", "github-token", "assigned-secret"):
        assert PLANTED[rule].split()[-1].strip('"') not in str(findings[0])


def test_reviewed_lines_can_opt_out():
    assert secrets.scan_text(PLANTED["hf-token"] + "  # hitoban: allow-secret (fake, for a test)\n", "f.py") == []


def test_near_misses_are_not_secrets():
    clean = ("hf_short = 1\npassword = '${PASSWORD}'\napi_key = os.environ['KEY']\nsee https://example.com\n"
             "mail info@example.com or someone@users.noreply.github.com\n/home/ is a folder\nsk-learn\n")
    assert secrets.scan_text(clean, "f.py") == []


def line_by_line(text: str, exempt: set[str] = frozenset()) -> list[secrets.Finding]:
    """The scan's definition: every rule over every line not marked as reviewed."""
    findings = []
    for number, line in enumerate(text.splitlines(), 1):
        if any(marker in line for marker in secrets.ALLOW_MARKERS):
            continue
        for rule, pattern in secrets.RULES.items():
            for m in pattern.finditer(line) if rule not in exempt else ():
                if rule != "email" or not secrets.EMAIL_ALLOWED.search(m.group(0)):
                    snippet = (line[:m.start()][-20:] + secrets.mask_secret(m.group(0)) + line[m.end():][:20])
                    findings.append(secrets.Finding("f", number, rule, snippet.strip()[:70]))
    return findings


# pieces a text is made of: planted secrets (and their halves, so one can straddle a line break), near misses,
# reviewed-line markers, bare tokens (a word character glued before one fails its \b), and every
# separator str.splitlines() breaks on
PIECES = [*PLANTED.values(), *(v[: len(v) // 2] for v in PLANTED.values()), *(v[len(v) // 2:] for v in
          PLANTED.values()), "hf_short", "info@example.com", "Authorization: ", "Bearer ", "password = ", "'",
          '"', " ", "x", "日本語", "/home/", *secrets.ALLOW_MARKERS, "\n", "\r\n", "\r", "\x0b", "\x0c", "\x1c",
          "\x85", "\u2028", "\u2029", "\t", "_", HF_TOKEN,
          "AKIA" + "ABCDEFGH12345678", "ghp_" + "a1B2c3" * 5]


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(PIECES), max_size=30), exempt=st.sets(st.sampled_from(sorted(secrets.RULES))))
def test_the_scan_finds_what_every_rule_finds_on_every_line(parts, exempt):
    """The scan skips rules that match nowhere in the text (issue: a clean tokenizer.json took one regex per rule
    per line); on any text, with any rules exempt, it finds exactly what the line-by-line definition finds."""
    text = "".join(parts)
    assert secrets.scan_text(text, "f", exempt) == line_by_line(text, exempt)


def test_directory_scan_names_forbidden_files_and_skips_caches(tmp_path):
    (tmp_path / ".env").write_text("X=1\n")
    (tmp_path / "server.pem").write_text("nothing\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.txt").write_text(HF_TOKEN)
    (tmp_path / "notes.md").write_text(f"ok\n{PLANTED['hf-token']}\n")
    found = {(f.path, f.line, f.rule) for f in secrets.scan_directory(tmp_path)}
    assert found == {(".env", 0, "forbidden-file"), ("server.pem", 0, "forbidden-file"), ("notes.md", 2, "hf-token")}


def test_git_history_finds_a_token_deleted_from_the_tree(tmp_path, capsys):
    from hitoban.cli import main

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@t.test")
    git("config", "user.name", "t")
    (tmp_path / "train.py").write_text("print('hello')\n")
    git("add", ".")
    git("commit", "-qm", "clean")
    (tmp_path / "train.py").write_text(f"print('hello')\nHF = '{HF_TOKEN}'\n")
    git("commit", "-qam", "oops")
    (tmp_path / "train.py").write_text("print('hello')\n")
    git("commit", "-qam", "remove the token")
    assert main(["secrets", str(tmp_path)]) == 0  # the working tree is clean...
    assert main(["secrets", str(tmp_path), "--git"]) == 1  # ...the history is not
    out = capsys.readouterr().out
    assert ":train.py:2 [hf-token]" in out and HF_TOKEN not in out


def test_the_scan_respects_gitignore_and_marked_test_data_and_says_so(tmp_path, capsys):
    from hitoban.cli import main

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text(PLANTED["hf-token"] + "\n")
    (tmp_path / "canaries").mkdir()
    (tmp_path / "canaries" / "canaries.json").write_text(PLANTED["email"] + "\n")
    # negative control: unmarked and not ignored, both are found
    assert {f.rule for f in secrets.scan_directory(tmp_path)} == {"hf-token", "email"}
    (tmp_path / ".gitignore").write_text("out/\n")
    (tmp_path / "canaries" / TEST_DATA_MARKER).write_text("fake contacts\n")
    report = secrets.scan_report(tmp_path)
    assert report.findings == [] and report.ignored == ["out/notes.txt"]
    assert report.test_data == ["canaries/HITOBAN_TEST_DATA", "canaries/canaries.json"]
    assert main(["secrets", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "skipped 1 git-ignored file(s) in out" in out and "marked test data" in out
    assert secrets.scan_directory(tmp_path, respect_gitignore=False)[0].rule == "hf-token"


@pytest.mark.slow(seconds=135)  # the session's demo, where this test builds it
def test_the_readme_order_on_a_clean_clone(tmp_path, demo):
    """Issue 13: install -> `hitoban demo` -> the tests -> `hitoban secrets . --git`, in that order, in a clean clone.
    The demo writes its fake contacts into the clone (hitoban-demo/, git-ignored); the source-tree check and the
    README's secret scan must still pass. The demo's output is the session's one demo (tests/conftest.py), placed
    where a demo run from the clone puts it (its default --out)."""
    import inspect

    from conftest import REPO

    from hitoban.cli import main
    from hitoban.demo import run_demo

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    assert inspect.signature(run_demo).parameters["out"].default == "hitoban-demo"
    shutil.copytree(demo[0], clone / "hitoban-demo")
    planted = json.loads((clone / "hitoban-demo" / "pii-canaries" / "canaries.json").read_text())
    assert planted and "@" in planted[0]["value"] + planted[2]["value"]  # the fake contacts are really there
    assert [str(f) for f in secrets.scan_directory(clone)] == []  # test_the_hitoban_source_tree_is_clean
    assert main(["secrets", str(clone), "--git"]) == 0  # the README's step
    (clone / "notes.txt").write_text(HF_TOKEN + "\n")  # negative control: the same scan, outside the ignored folder
    assert [f.rule for f in secrets.scan_directory(clone)] == ["hf-token"]


def test_the_hitoban_source_tree_is_clean():
    from conftest import REPO

    assert [str(f) for f in secrets.scan_directory(REPO)
            if not f.path.startswith(("build/", "hitoban.egg-info/"))] == []
