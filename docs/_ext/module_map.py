"""The ``module-map`` directive: every module of the package with the first line of its
docstring, read from the source, so the map of the code cannot drift from the code."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from docutils import nodes
from interval_settings import table_row
from sphinx.util.docutils import SphinxDirective

PACKAGE = Path(__file__).resolve().parents[2] / "celery_interval"


def _modules() -> list[tuple[str, Path]]:
    """(dotted name, path) of every module and package of celery_interval, in path order."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] in ("__init__", "__main__") else parts)
        if parts[-1] == "__main__":
            name += " (python -m)"
        found.append((name, path))
    return found


def _summary(path: Path) -> str:
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return " ".join(docstring.split("\n\n")[0].split())


class ModuleMap(SphinxDirective):
    """A table: module, what it is for (its docstring's first paragraph)."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        table = nodes.table(classes=["module-map"])
        group = nodes.tgroup(cols=2)
        for width in (30, 70):
            group += nodes.colspec(colwidth=width)
        body = nodes.tbody()
        for name, path in _modules():
            self.env.note_dependency(str(path))
            body += table_row([[nodes.literal(name, name)], [nodes.Text(_summary(path))]])
        group += body
        table += group
        return [table]


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("module-map", ModuleMap)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
