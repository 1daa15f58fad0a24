"""The ``interval-settings`` directive: the settings reference, rendered from
``celery_interval.defaults.SETTINGS`` so that the table and the code cannot disagree."""

from __future__ import annotations

from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective


def _default_text(setting: Any) -> str:
    """How a default reads in the table: its ``shown`` text, else its Python literal."""
    if setting.shown:
        return setting.shown
    return f"``{setting.default!r}``"


class IntervalSettings(SphinxDirective):
    """A table of every ``app.conf`` setting: key, default, meaning."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from celery_interval import defaults
        from celery_interval.defaults import SETTINGS

        self.env.note_dependency(defaults.__file__)  # rebuild when the table changes

        lines = [
            ".. list-table::",
            "   :header-rows: 1",
            "   :widths: 25 15 60",
            "",
            "   * - setting (``app.conf``)",
            "     - default",
            "     - meaning",
        ]
        for setting in SETTINGS:
            lines += [
                f"   * - ``{setting.key}``",
                f"     - {_default_text(setting)}",
                f"     - {setting.meaning}",
            ]
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source="celery_interval.defaults"), 0, container)
        return container.children


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("interval-settings", IntervalSettings)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
