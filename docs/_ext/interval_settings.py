"""The ``interval-settings`` and ``interval-fields`` directives: the settings reference and
the fields of a bucket's declaration, rendered from ``celery_interval.config.table``
(``SETTINGS``, ``FIELDS``) so that the tables and the code cannot disagree.

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
        from celery_interval.config import table as settings_table

        self.env.note_dependency(settings_table.__file__)  # rebuild when the table changes
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
        for setting in settings_table.SETTINGS:
            key = nodes.literal(setting.key, setting.key)
            target = nodes.target("", "", ids=[f"setting-{setting.key}"])
            body += table_row([[target, key], _default_text(setting), _inline(setting.meaning)])
        group += head
        group += body
        table += group
        return [table]


class IntervalFields(SphinxDirective):
    """A table of every field of a bucket's declaration: field, example, meaning."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from celery_interval.config import table as settings_table

        self.env.note_dependency(settings_table.__file__)
        table = nodes.table(classes=["interval-fields"])
        group = nodes.tgroup(cols=3)
        for width in (15, 35, 50):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        head += table_row([[nodes.Text("field")], [nodes.Text("example")], [nodes.Text("meaning")]])
        body = nodes.tbody()
        for field in settings_table.FIELDS:
            target = nodes.target("", "", ids=[f"field-{field.name.replace('_', '-')}"])
            name = nodes.literal(field.name, field.name)
            example = nodes.literal(field.example, field.example)
            body += table_row([[target, name], [example], _inline(field.meaning)])
        group += head
        group += body
        table += group
        return [table]


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("interval-settings", IntervalSettings)
    app.add_directive("interval-fields", IntervalFields)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
