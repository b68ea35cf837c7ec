"""No hidden inputs (issue 36): product code reads no `HITOBAN_*` environment variable except through
training/faults.py, the one module that owns them (and documents each). This test reads every .py under modeling/,
training/, evaluation/, release/ and hitoban/ with ast and fails naming file:line for any `os.environ` /
`os.getenv` read of a HITOBAN_ name elsewhere: `os.environ["X"]`, `.get`, `.pop`, `.setdefault`, `"X" in
os.environ`, `os.getenv("X")`, with X a literal, an f-string or a module constant (of any scanned file) naming
HITOBAN_...; `from os import environ, getenv` too."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

FOLDERS = ("modeling", "training", "evaluation", "release", "hitoban")
OWNER = Path("training/faults.py")
PREFIX = "HITOBAN_"


def constants(trees: dict[Path, ast.Module]) -> set[str]:
    """Names assigned a HITOBAN_ string at module level in any file (`PAUSE_ENV = "HITOBAN_..."`): a read through
    such a name (imported or not) is a read of that variable."""
    found = set()
    for tree in trees.values():
        for node in tree.body:
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else [])
            if names_hitoban(node.value, set()) if targets else False:
                found |= {t.id for t in targets if isinstance(t, ast.Name)}
    return found


def names_hitoban(node: ast.AST | None, hitoban_names: set[str]) -> bool:
    """Whether the expression `node` is a HITOBAN_ variable name: a literal, an f-string starting with one, or a
    constant known to hold one."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value.startswith(PREFIX)
    if isinstance(node, ast.JoinedStr):
        return bool(node.values) and names_hitoban(node.values[0], hitoban_names)
    if isinstance(node, ast.Name):
        return node.id in hitoban_names
    if isinstance(node, ast.Attribute):  # module.CONSTANT
        return node.attr in hitoban_names
    return False


def is_environ(node: ast.AST, aliases: set[str]) -> bool:
    """`os.environ` (or `environ` imported from os)."""
    return ((isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)
             and node.value.id == "os") or (isinstance(node, ast.Name) and node.id in aliases))


def reads(tree: ast.Module, hitoban_names: set[str]) -> list[int]:
    """Lines of every read of a HITOBAN_ environment variable in `tree`."""
    environ_aliases, getenv_aliases = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            for alias in node.names:
                if alias.name == "environ":
                    environ_aliases.add(alias.asname or alias.name)
                elif alias.name == "getenv":
                    getenv_aliases.add(alias.asname or alias.name)
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and is_environ(node.value,
                                                                                             environ_aliases):
            if names_hitoban(node.slice, hitoban_names):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and node.args and names_hitoban(node.args[0], hitoban_names):
            func = node.func
            if ((isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault")
                 and is_environ(func.value, environ_aliases))
                    or (isinstance(func, ast.Attribute) and func.attr == "getenv" and isinstance(func.value, ast.Name)
                        and func.value.id == "os")
                    or (isinstance(func, ast.Name) and func.id in getenv_aliases)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and names_hitoban(node.left, hitoban_names):
            if any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and any(
                    is_environ(c, environ_aliases) for c in node.comparators):
                lines.append(node.lineno)
    return sorted(lines)


def hidden_inputs(root: Path) -> list[str]:
    """'file:line' of every HITOBAN_ environment read under FOLDERS of `root` outside training/faults.py."""
    trees = {path: ast.parse(path.read_text(encoding="utf-8"), str(path))
             for folder in FOLDERS for path in sorted((root / folder).rglob("*.py"))}
    hitoban_names = constants(trees)
    return [f"{path.relative_to(root)}:{line}" for path, tree in trees.items() if path.relative_to(root) != OWNER
            for line in reads(tree, hitoban_names)]


def test_no_module_reads_a_hitoban_environment_variable_except_training_faults():
    found = hidden_inputs(REPO)
    assert not found, ("HITOBAN_* environment variables read outside training/faults.py (add a hook there and read "
                       "it with faults.active()): " + ", ".join(found))


def test_the_scan_finds_every_form_of_read_and_ignores_writes_and_other_names(tmp_path):
    """Negative control: a tree with each form of read is reported line by line; writes, other variables and the
    owner module are not."""
    (tmp_path / "training").mkdir()
    (tmp_path / "hitoban").mkdir()
    (tmp_path / "training" / "hooks.py").write_text('PAUSE_ENV = "HITOBAN_PAUSE"\n')
    (tmp_path / "training" / "faults.py").write_text('import os\nos.environ.get("HITOBAN_FAULTS")\n')
    (tmp_path / "hitoban" / "bad.py").write_text(
        "import os\n"                                           # 1
        "from os import environ as env, getenv\n"               # 2
        "from hitoban.training.hooks import PAUSE_ENV\n"        # 3
        'a = os.environ.get("HITOBAN_A")\n'                     # 4
        'b = os.environ["HITOBAN_B"]\n'                         # 5
        "c = os.getenv(PAUSE_ENV)\n"                            # 6
        'd = "HITOBAN_D" in os.environ\n'                       # 7
        'e = env.get(f"HITOBAN_{a}")\n'                         # 8
        'f = getenv("HITOBAN_F", "0")\n'                        # 9
        'os.environ["HITOBAN_W"] = "1"\n'                       # 10: a write (a child's environment), not a read
        'g = os.environ.get("OMP_NUM_THREADS")\n'               # 11: not hitoban's
        'h = os.environ.pop("HITOBAN_H", None)\n')              # 12
    assert hidden_inputs(tmp_path) == [f"hitoban/bad.py:{n}" for n in (4, 5, 6, 7, 8, 9, 12)]
