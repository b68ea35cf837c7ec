"""No function or method in product code is over 80 lines (issue 36): a longer one is a sequence of steps that want
names and a docstring each. The check reads every .py file under the product folders with `ast` (a function's
lines: from its `def` through its last statement, docstring included) and fails naming file:line:function for each
one over the limit; its negative control runs the same check on a generated 81-line function."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

LIMIT = 80
PRODUCT = ("modeling", "training", "evaluation", "release", "hitoban", "spaces")


def long_functions(source: str, name: str) -> list[str]:
    """`name:line:function (N lines)` for every function or method in `source` over LIMIT lines."""
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > LIMIT:
                found.append(f"{name}:{node.lineno}:{node.name} ({lines} lines)")
    return sorted(found)


def product_files() -> list[Path]:
    return sorted(path for folder in PRODUCT for path in (REPO / folder).rglob("*.py"))


def test_no_product_function_is_over_80_lines():
    files = product_files()
    assert len(files) > 50  # the folders were found
    found = [hit for path in files
             for hit in long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))]
    assert not found, f"functions over {LIMIT} lines (split them into named steps):\n" + "\n".join(found)


def generated(body_lines: int, indent: str = "") -> str:
    """A function whose `def` and body together are 1 + body_lines lines."""
    body = "".join(f"{indent}    x{n} = {n}\n" for n in range(body_lines - 1))
    return f"{indent}def generated():\n{body}{indent}    return 0\n"


def test_negative_control_an_81_line_function_fails():
    assert long_functions(generated(LIMIT - 1), "ok.py") == []  # 80 lines: allowed
    assert long_functions(generated(LIMIT), "long.py") == ["long.py:1:generated (81 lines)"]
    method = "class C:\n" + generated(LIMIT, indent="    ")  # methods count too
    assert long_functions(method, "method.py") == ["method.py:2:generated (81 lines)"]
