"""The private redis-server of the tests is the package's embedded one."""

from __future__ import annotations

from celery_interval.embedded import RedisProc, find_redis_server

__all__ = ["RedisProc", "find_redis_server"]
