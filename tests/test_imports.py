"""Imports at the top of modules (issue 36): a module's top shows its dependencies. A function-level import is
allowed only where start-up time or an optional extra needs it, and says so:

- in a module whose import loads torch anyway (found statically: it imports torch, transformers, Accelerate or PEFT,
  or a hitoban module that does, at its top), a function-level import must sit in a `try` (an optional import) or
  carry a `# lazy: why` comment on its line;
- a module kept light (its import loads neither) may import lazily, and its docstring (or its package's) says why,
  with "Lazy imports" or "at import".

The negative controls run the same check on generated modules that break each rule."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

AREAS = ("modeling", "training", "evaluation", "release", "hitoban")
HEAVY_LIBRARIES = ("torch", "transformers", "accelerate", "peft")
SAYS_WHY = re.compile(r"lazy imports|at import", re.IGNORECASE)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) if parts[0] == "hitoban" else "hitoban." + ".".join(parts)


def top_level(tree: ast.Module) -> set[int]:
    """ids of the statements that run at import: the module's body, and the bodies of its top-level try/if."""
    ids = {id(n) for n in tree.body}
    for node in tree.body:
        if isinstance(node, (ast.Try, ast.If)):
            ids |= {id(m) for m in ast.walk(node)}
    return ids


def imported(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """The absolute module names a statement imports (a `from X import y` may import the module X.y)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def heavy_modules(sources: dict[str, tuple[str, str]]) -> set[str]:
    """Modules whose import loads torch: `sources` maps a module name to (its source, its package)."""
    edges: dict[str, set[str]] = {}
    for name, (source, package) in sources.items():
        tree = ast.parse(source)
        at_import = top_level(tree)
        names = {m for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) in at_import
                 for m in imported(n, package)}
        parents = {".".join(name.split(".")[:i]) for i in range(2, len(name.split(".")))}
        edges[name] = names | parents
    heavy = {name for name, names in edges.items()
             if any(m == lib or m.startswith(lib + ".") for m in names for lib in HEAVY_LIBRARIES)}
    grew = True
    while grew:
        grew = False
        for name, names in edges.items():
            if name not in heavy and names & heavy:
                heavy.add(name)
                grew = True
    return heavy


def in_try(node: ast.AST, parents: dict) -> bool:
    """Whether `node` sits in a `try` (an optional import, its absence handled)."""
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, ast.Try):
            return True
    return False


def offences(sources: dict[str, tuple[str, str]], docstrings: dict[str, str]) -> list[str]:
    """`module:line` for every function-level import that breaks the rules above."""
    heavy = heavy_modules(sources)
    found = []
    for name, (source, _) in sources.items():
        tree = ast.parse(source)
        at_import, lines = top_level(tree), source.splitlines()
        parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        lazy = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in at_import]
        if name in heavy:
            found += [f"{name}:{n.lineno} (imports torch anyway: move it to the top, or say `# lazy: why`)"
                      for n in lazy if not in_try(n, parents) and "# lazy:" not in lines[n.lineno - 1]]
        elif lazy and not any(SAYS_WHY.search(docstrings.get(owner, ""))
                              for owner in (name, name.rsplit(".", 1)[0])):
            found.append(f"{name}:{lazy[0].lineno} (a light module importing lazily: say why in its docstring)")
    return found


def product_sources() -> tuple[dict, dict]:
    sources, docstrings = {}, {}
    for area in AREAS:
        for path in sorted((REPO / area).rglob("*.py")):
            name, source = module_name(path), path.read_text(encoding="utf-8")
            package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
            sources[name] = (source, package)
            docstrings[name] = ast.get_docstring(ast.parse(source)) or ""
    return sources, docstrings


def test_function_level_imports_are_at_the_top_or_say_why():
    sources, docstrings = product_sources()
    assert len(sources) > 60
    assert not offences(sources, docstrings), "\n".join(offences(sources, docstrings))


def test_the_static_reading_finds_the_heavy_modules():
    """The heavy set is read statically; spot-check it against what importing does (modules the light verbs use
    must stay light, the night's modules are heavy)."""
    heavy = heavy_modules(product_sources()[0])
    assert {"hitoban.training.pretrain.trainer", "hitoban.modeling.loading", "hitoban.evaluation.bpc"} <= heavy
    assert not heavy & {"hitoban.cli", "hitoban.training.pretrain.watch", "hitoban.release.card",
                        "hitoban.evaluation.leaks", "hitoban.run_folder", "hitoban.training.device"}


def test_negative_controls_each_rule_fails():
    heavy_module = "import torch\n\ndef f():\n    import json\n    return json\n"
    marked = "import torch\n\ndef f():\n    import gguf  # lazy: an optional extra\n    return gguf\n"
    guarded = "import torch\n\ndef f():\n    try:\n        import fcntl\n    except ImportError:\n        return None\n"
    light = '"""A light module."""\n\ndef f():\n    import torch\n    return torch\n'
    light_says = '"""A light module. Lazy imports: torch only when f runs."""\n\ndef f():\n    import torch\n'
    sources = {f"hitoban.x.{k}": (v, "hitoban.x") for k, v in
               dict(heavy_module=heavy_module, marked=marked, guarded=guarded, light=light,
                    light_says=light_says).items()}
    docstrings = {name: ast.get_docstring(ast.parse(src)) or "" for name, (src, _) in sources.items()}
    assert sorted(o.split(":")[0] for o in offences(sources, docstrings)) == ["hitoban.x.heavy_module",
                                                                              "hitoban.x.light"]
    # a module that imports a heavy hitoban module is heavy too
    chained = {"hitoban.x.a": ("import torch\n", "hitoban.x"),
               "hitoban.x.b": ("from hitoban.x import a\n", "hitoban.x")}
    assert heavy_modules(chained) == {"hitoban.x.a", "hitoban.x.b"}
