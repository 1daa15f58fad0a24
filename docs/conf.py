"""Sphinx configuration of the celery_interval documentation."""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # document the source tree this file belongs to
sys.path.insert(0, str(HERE / "_ext"))

import celery_interval  # noqa: E402

project = "celery_interval"
author = "celery_interval contributors"
copyright = "celery_interval contributors, MIT licence"
release = celery_interval.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx_click",
    "interval_settings",
    "module_map",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"


html_theme = "alabaster"
html_title = f"celery_interval {release}"


def _escape_lone_stars(_app: object, _ctx: object, lines: list[str]) -> None:
    """Click help texts are plain text: a glob such as ``'api:shop-*'`` must not open an
    emphasis in the rendered reference (``**Required**``, sphinx-click's own markup, stays)."""
    lines[:] = [re.sub(r"(?<![*\\])\*(?!\*)", r"\\*", line) for line in lines]


def setup(app: object) -> None:
    app.connect("sphinx-click-process-options", _escape_lone_stars)  # type: ignore[attr-defined]
    app.connect("sphinx-click-process-arguments", _escape_lone_stars)  # type: ignore[attr-defined]
