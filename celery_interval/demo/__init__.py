"""The demo: `celery-interval demo` runs a real pool on an embedded Redis and reports figures."""

from __future__ import annotations

from celery_interval.demo.run import DemoOptions, run_demo

__all__ = ["DemoOptions", "run_demo"]
