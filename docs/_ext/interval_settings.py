"""The ``interval-settings`` directive: the settings reference, rendered from
``celery_interval.defaults.SETTINGS`` so that the table and the code cannot disagree.

The table is built from docutils nodes (not from reStructuredText source), so the directive
works the same in a MyST Markdown page and in a reStructuredText one."""

from __future__ import annotations

import re
from typing import Any

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

#: ````literal```` spans in a setting's meaning (the only markup the table uses).
_LITERAL = re.compile(r"``(.+?)``")


def _inline(text: str) -> list[nodes.Node]:
    """``text`` as text and literal nodes."""
    parts: list[nodes.Node] = []
    pos = 0
    for match in _LITERAL.finditer(text):
        if match.start() > pos:
            parts.append(nodes.Text(text[pos : match.start()]))
        parts.append(nodes.literal(match.group(1), match.group(1)))
        pos = match.end()
    if pos < len(text):
        parts.append(nodes.Text(text[pos:]))
    return parts


def _default_text(setting: Any) -> list[nodes.Node]:
    """How a default reads in the table: its ``shown`` text, else its Python literal."""
    if setting.shown:
        return [nodes.Text(setting.shown)]
    literal = repr(setting.default)
    return [nodes.literal(literal, literal)]


def table_row(cells: list[list[nodes.Node]]) -> nodes.row:
    """One table row, a paragraph per cell."""
    row = nodes.row()
    for content in cells:
        entry = nodes.entry()
        entry += nodes.paragraph("", "", *content)
        row += entry
    return row


class IntervalSettings(SphinxDirective):
    """A table of every ``app.conf`` setting: key, default, meaning."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from celery_interval import defaults

        self.env.note_dependency(defaults.__file__)  # rebuild when the table changes
        table = nodes.table(classes=["interval-settings"])
        group = nodes.tgroup(cols=3)
        for width in (25, 15, 60):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        head += table_row(
            [
                [nodes.Text("setting ("), nodes.literal("app.conf", "app.conf"), nodes.Text(")")],
                [nodes.Text("default")],
                [nodes.Text("meaning")],
            ]
        )
        body = nodes.tbody()
        for setting in defaults.SETTINGS:
            key = nodes.literal(setting.key, setting.key)
            target = nodes.target("", "", ids=[f"setting-{setting.key}"])
            body += table_row([[target, key], _default_text(setting), _inline(setting.meaning)])
        group += head
        group += body
        table += group
        return [table]


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("interval-settings", IntervalSettings)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
