"""A Django settings snippet: with ``app.config_from_object("django.conf:settings",
namespace="CELERY")`` every ``interval_*`` setting is spelled ``CELERY_INTERVAL_*``."""

from __future__ import annotations

CELERY_BROKER_URL = "amqp://guest:guest@localhost//"
CELERY_INTERVAL_STORE_URL = "redis://localhost:6379/0"
CELERY_INTERVAL_QUEUES = {"api": 1.0, "mail": "30/m"}
CELERY_INTERVAL_MAX_HELD = 400
CELERY_INTERVAL_LEASE_S = 30.0
