"""The worker side: the consumer bootstep and the services it runs inside a Celery worker."""

from __future__ import annotations
