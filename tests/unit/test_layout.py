"""The package's layout rules: no import cycle, small modules, each saying what it is for."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "celery_interval"
MAX_LINES = 400
#: Modules allowed past MAX_LINES, and why.
LONG_MODULES: dict[str, str] = {}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules of the package that ``name`` imports anywhere (functions included), except
    under ``if TYPE_CHECKING``; ``from pkg import sub`` counts as importing ``sub`` only."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            subs = [f"{base}.{alias.name}" for alias in node.names]
            found.update(sub for sub in subs if sub in modules)
            if base in modules and not all(sub in modules for sub in subs):
                found.add(base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    found.discard(name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycles = _cycles(graph)
    shown = [
        " -> ".join(f"{m} ({', '.join(sorted(graph[m] & set(c)))})" for m in c) for c in cycles
    ]
    assert not cycles, "import cycles:\n" + "\n".join(shown)


@pytest.mark.parametrize("name", sorted(_modules()))
def test_each_module_is_small_and_says_what_it_is_for(name: str) -> None:
    path = _modules()[name]
    text = path.read_text()
    tree = ast.parse(text)
    docstring = ast.get_docstring(tree)
    assert docstring, f"{name} has no docstring saying what it is for"
    assert "from __future__ import annotations" in text or not text.strip(), name
    lines = len(text.splitlines())
    assert lines <= MAX_LINES or name in LONG_MODULES, (
        f"{name} has {lines} lines (more than {MAX_LINES} wants a reason in LONG_MODULES)"
    )


#: The longest a function of the package may be, its signature and docstring included. The
#: few past 60 are the model's claims (``schedule.core.claim``, ``schedule.fair_claim.
#: claim_fair``) and the pool process's claim again (``worker.process.started``): one decision
#: each, read top to bottom, whose long part is its parameters and their docstring.
MAX_FUNCTION_LINES = 70


def test_no_function_is_long() -> None:
    long = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert not long, "split these functions:\n" + "\n".join(long)
