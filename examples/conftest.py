"""Opt in to the celery_interval pytest plugin (in your own top-level conftest.py)."""

pytest_plugins = ["celery_interval.testing"]
