"""Sphinx configuration of the celery_interval documentation."""

from __future__ import annotations

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
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"


html_theme = "alabaster"
html_title = f"celery_interval {release}"
