"""The model store as a Redis Cluster runs the scripts: no birth marker (born = now)."""

from __future__ import annotations

from celery_interval.stores.memory import MemoryStore


class ClusterModel(MemoryStore):
    """The model as a Redis Cluster runs it: no birth marker (born = now)."""

    def _store_born_us(self, now_us: int, write: bool) -> int:
        return now_us

    def _places_born_us(self, now_us: int, write: bool) -> int | None:
        return None
