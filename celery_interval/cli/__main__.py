"""``python -m celery_interval.cli``: the ``celery-interval`` program."""

from __future__ import annotations

from celery_interval.cli.tool import main

main()
