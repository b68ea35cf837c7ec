"""Imports run one way: the "Where things are" table of docs/how-it-works.md is the contract, and this test reads
every import in the tree against it, so a wrong arrow fails with its file and line; and no module reaches itself
again through its imports (an import circle fails with its modules)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

LAYOUT = REPO / "docs" / "how-it-works.md"  # its "Where things are" table is the contract

# the table's names -> module prefixes ("training root": each top-level module of training/, not its rooms)
NAMES = {"modeling": "hitoban.modeling", "training": "hitoban.training", "evaluation": "hitoban.evaluation",
         "release": "hitoban.release", "hitoban.errors": "hitoban.errors", "hitoban.files": "hitoban.files",
         "hitoban.provenance": "hitoban.provenance", "hitoban.options": "hitoban.options",
         "hitoban.run_folder": "hitoban.run_folder", "training.data": "hitoban.training.data",
         "training.pretrain": "hitoban.training.pretrain",
         "training.finetune": "hitoban.training.finetune", "training.federated": "hitoban.training.federated",
         "training root": None}
AREAS = {"modeling", "training", "evaluation", "release"}  # folders setup.py installs as hitoban.<name>


def prefixes(names: set[str], root: Path) -> set[str]:
    """The module prefixes a row's names allow, in the tree at `root`."""
    found = {NAMES[n] for n in names if NAMES[n]}
    if "training root" in names:
        found |= {f"hitoban.training.{p.stem}" for p in (root / "training").glob("*.py") if p.stem != "__init__"}
    return found


def read_rules(readme: str) -> list[tuple[list[str], set[str] | None]]:
    """(paths, allowed names or None for anything) per table row, in the table's order."""
    section = readme.split("## Where things are", 1)[1].split("\n## ", 1)[0]
    rules = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        paths_cell, _, allowed_cell = [cell.strip() for cell in line.strip("|").split("|")]
        paths = re.findall(r"`([^`]+)`", paths_cell)
        names = [name.strip() for name in allowed_cell.split(",")]
        if names == ["anything"]:
            rules.append((paths, None))
        elif names == ["nothing"]:
            rules.append((paths, set()))
        else:
            unknown = [n for n in names if n not in NAMES]
            assert not unknown, f"the layout table names {unknown}: not a layer this test knows"
            rules.append((paths, set(names)))
    return rules


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[0] in AREAS:
        parts = ["hitoban", *parts]
    return ".".join(p for p in parts if p != "__init__")


def is_module(root: Path, dotted: str) -> bool:
    parts = dotted.split(".")
    if parts[0] != "hitoban" or len(parts) < 2:
        return False
    path = root.joinpath(*parts[1:]) if parts[1] in AREAS else root.joinpath(*parts)
    return path.with_suffix(".py").exists() or path.is_dir()


def imports(root: Path, path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every import of hitoban in `path`; `from hitoban import x` names x's module when
    x is a submodule, else the package root."""
    module = module_name(root, path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.append((node.lineno, candidate if is_module(root, candidate) else base))
    return sorted({(line, name) for line, name in found if name == "hitoban" or name.startswith("hitoban.")})


def violations(root: Path, rules) -> list[str]:
    """Every import a file's row does not allow, as 'path:line imports X; FOLDER may import only ...'."""
    problems, claimed = [], set()
    for paths, names in rules:
        allowed = None if names is None else prefixes(names, root)
        files = []
        for spec in paths:
            target = root / spec.rstrip("/")
            files += sorted(target.rglob("*.py")) if target.is_dir() else [target] if target.exists() else []
        files = [f for f in files if f not in claimed]  # a file named in an earlier row belongs to that row
        claimed.update(files)
        for path in files:
            for line, name in imports(root, path):
                if allowed is not None and not any(name == p or name.startswith(p + ".") for p in allowed):
                    problems.append(f"{path.relative_to(root)}:{line} imports {name}; {', '.join(paths)} may import "
                                    f"only {', '.join(sorted(allowed)) or 'nothing of hitoban'}")
    return problems


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the hitoban modules it imports (anywhere in the file: a lazy import is an arrow too)."""
    graph = {}
    for folder in (*sorted(AREAS), "hitoban"):
        for path in sorted((root / folder).rglob("*.py")):
            module = module_name(root, path)
            graph[module] = {name for _, name in imports(root, path) if name != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle: the strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in graph:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_module_imports_itself_through_others():
    assert circles(import_graph(REPO)) == []


def test_an_import_circle_is_found_with_its_modules(tmp_path):
    """Negative control: a lazy import back from b to a closes a circle a -> b -> a; c -> a beside it does not."""
    for folder in ("modeling", "training", "evaluation", "release", "hitoban"):
        (tmp_path / folder).mkdir()
    (tmp_path / "training" / "a.py").write_text("from hitoban.training.b import x\n")
    (tmp_path / "training" / "b.py").write_text("def x():\n    from hitoban.training import a\n")
    (tmp_path / "training" / "c.py").write_text("from hitoban.training.a import x\n")
    assert circles(import_graph(tmp_path)) == [["hitoban.training.a", "hitoban.training.b"]]


def test_every_import_follows_the_readme_table():
    rules = read_rules(LAYOUT.read_text(encoding="utf-8"))
    assert len(rules) >= 6
    covered = {p for paths, _ in rules for p in paths}
    for folder in ("modeling/", "training/data/", "training/pretrain/", "training/finetune/", "training/",
                   "evaluation/", "release/", "hitoban/", "spaces/"):
        assert any(p == folder or p.startswith(folder) for p in covered), f"the layout table has no row for {folder}"
    assert violations(REPO, rules) == []


def test_a_wrong_import_fails_with_its_file_and_line(tmp_path):
    """Negative control: a training module that imports evaluation, one that imports the package root, and a
    modeling module that imports training are each reported; the allowed imports beside them are not."""
    rules = read_rules(LAYOUT.read_text(encoding="utf-8"))
    for folder in ("modeling", "training", "evaluation", "release", "hitoban", "spaces"):
        (tmp_path / folder).mkdir()
    (tmp_path / "hitoban" / "errors.py").write_text("")
    (tmp_path / "hitoban" / "provenance.py").write_text("")
    (tmp_path / "training" / "good.py").write_text("from hitoban.modeling import HitobanConfig\nfrom . import good\n")
    (tmp_path / "training" / "bad.py").write_text(
        "import json\n\nfrom hitoban.evaluation.bpc import bits_per_char\nfrom hitoban import __version__\n")
    (tmp_path / "modeling" / "export.py").write_text("from hitoban.errors import CheckFailed\n"
                                                     "from ..training import tokenizer\n")
    (tmp_path / "release" / "card.py").write_text("from hitoban.provenance import sha256_file\n")
    found = violations(tmp_path, rules)
    assert len(found) == 3, found
    assert found[0].startswith("modeling/export.py:2 imports hitoban.training;")
    assert found[1].startswith("training/bad.py:3 imports hitoban.evaluation.bpc")
    assert found[2].startswith("training/bad.py:4 imports hitoban;")
