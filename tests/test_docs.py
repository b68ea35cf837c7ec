"""The pages stay true (issue 38): every link between the README and the guides resolves (to a file, and to a heading
where it names one), the command reference is what the verbs' parsers print, the front page repeats no guide, and
every row of the results page names its machine, date and command. Each check has a negative control."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

from hitoban.verbs.reference import command_reference

PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {anchor(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def broken_links(pages: list[Path]) -> list[str]:
    """'page: target' for every relative link whose file (or heading) is not there; web links are not followed."""
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for match in LINK.finditer(text):
            target = match[1] or match[2]
            if re.match(r"[a-z]+:", target):
                continue
            path, _, fragment = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists() or (fragment and file.suffix == ".md" and fragment not in anchors(file)):
                broken.append(f"{page.name}: {target}")
    return broken


def test_every_link_between_the_pages_resolves(tmp_path):
    assert broken_links(PAGES) == []
    assert len([p for p in PAGES if p.parent.name == "docs"]) >= 9  # the guides the README links to
    # negative control: a page with a link to a missing file, one to a missing heading, and good ones beside them
    (tmp_path / "a.md").write_text("# A page\n\n[b](b.md) [gone](gone.md) [x](b.md#no-such) [ok](b.md#the-b-page)\n"
                                   "[self](#a-page) [web](https://example.com/x)\n")
    (tmp_path / "b.md").write_text("# The B page\n")
    assert [line.split(": ")[1] for line in broken_links([tmp_path / "a.md"])] == ["gone.md", "b.md#no-such"]


def test_the_command_reference_is_what_the_parsers_print():
    """docs/commands.md is generated (`python -m hitoban.verbs.reference > docs/commands.md`); an option added,
    removed or re-defaulted anywhere changes the output and fails here until the page is written again."""
    page = (REPO / "docs" / "commands.md").read_text(encoding="utf-8")
    made = command_reference()
    assert page == made, "docs/commands.md is stale: run python -m hitoban.verbs.reference > docs/commands.md"
    for verb in ("corpus", "pretrain", "federate serve", "eval", "upload"):
        assert f"### `hitoban {verb}`" in made
    assert "--lr LR" in made and "(default: 1234)" in made  # options with their defaults, as --help shows them


def test_the_reference_changes_with_a_declaration(monkeypatch):
    """Negative control: a changed default in an option dataclass shows up in the generated page."""
    from hitoban.training.data import options

    field = options.CorpusOptions.__dataclass_fields__["min_chars"]
    assert "(default: 321)" not in command_reference()
    monkeypatch.setattr(field, "default", 321)
    assert "(default: 321)" in command_reference()


def sentences(text: str) -> set[str]:
    """The page's prose sentences of 80 characters or more, whitespace folded (code blocks and tables left out)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("|"))
    return {s for s in (" ".join(part.split()) for part in re.split(r"(?<=[.:;])\s", text)) if len(s) >= 80}


def test_the_front_page_repeats_no_guide():
    front = sentences((REPO / "README.md").read_text(encoding="utf-8"))
    guides = "\n".join(" ".join(p.read_text(encoding="utf-8").split()) for p in PAGES if p.name != "README.md")
    assert [s for s in front if s in guides] == []
    some = sorted(front)[0]  # negative control: a sentence copied into a guide is found
    assert some in guides + " " + some


def results_rows(text: str) -> list[dict[str, str]]:
    """Every row of every table on the page, as {header: cell}."""
    rows, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
        elif not set("".join(cells)) <= set("-: "):
            rows.append(dict(zip(header, cells)))
    return rows


def unnamed(rows: list[dict[str, str]], machines: set[str]) -> list[dict[str, str]]:
    """Rows without a known machine, a date, or a command that runs a script in benchmarks/ (or hitoban)."""
    return [r for r in rows if r.get("machine", "").strip("*") not in machines
            or not re.fullmatch(r"\*?\*?\d{4}-\d{2}-\d{2}\*?\*?", r.get("date", ""))
            or not re.search(r"`[^`]*(benchmarks/\w+\.(py|sh)|hitoban \w+)[^`]*`", r.get("command", ""))]


def test_every_result_names_its_machine_date_and_command():
    page = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    machines = set(re.findall(r"^- \*\*(\S+)\*\*:", page, re.M))  # the page's legend of machines
    rows = results_rows(page)
    assert len(rows) >= 10 and machines
    assert unnamed(rows, machines) == []
    broken = [{**rows[0], "date": "yesterday"}, {**rows[0], "machine": "my laptop"}, {**rows[0], "command": "ran it"}]
    assert len(unnamed(broken, machines)) == 3  # negative control


@pytest.mark.parametrize("page", [p.name for p in PAGES])
def test_every_page_is_reachable_from_the_front_page(page):
    linked = {Path(m[1] or m[2]).name for m in LINK.finditer((REPO / "README.md").read_text(encoding="utf-8"))}
    assert page == "README.md" or page in linked, f"docs/{page} is not linked from the README"
