"""A worker's hold caps with parking off: a queue stops at ``max_held`` tasks of one bucket or a
start ``max_ahead_s`` away, resumes at half of both, and each message looks at its own bucket
only (no scan over every bucket held)."""

from __future__ import annotations

import time
from typing import Any

from celery import Celery

from celery_interval.config import settings_of
from celery_interval.worker.held import Held
from celery_interval.worker.holding import Holding
from tests.helpers.fakes import Qos


def _holding(max_held: int = 4, max_ahead_s: float = 10.0) -> tuple[Holding, list[str]]:
    app = Celery("holding", set_as_current=False)
    app.conf.interval_store_url = "memory://"
    app.conf.interval_queues = {"api": 0.1, "api:*": 0.1}
    app.conf.interval_max_held = max_held
    app.conf.interval_max_ahead_s = max_ahead_s
    calls: list[str] = []
    qos = Qos()
    holding = Holding(
        settings_of(app),
        lambda: qos,
        lambda queue: calls.append(f"stop {queue}"),
        lambda queue: calls.append(f"resume {queue}"),
    )
    return holding, calls


def _held(bucket: str, n: int) -> Held:
    return Held(
        request=None, bucket=bucket, task_id=f"{bucket}-{n}", retries=0, queue="api",
        interval_us=100_000, not_before_in_us=0, holder=f"w/{n}", acks_late=False,
        release=lambda _: None,
    )  # fmt: skip


def _receive(holding: Holding, held: Held) -> None:
    holding.add(held)
    holding.apply_caps(held.queue, held.bucket)


def test_a_bucket_at_max_held_stops_its_queue_until_it_holds_half() -> None:
    holding, calls = _holding(max_held=4)
    tasks = [_held("api:a", n) for n in range(4)]
    other = _held("api:b", 0)
    _receive(holding, other)
    for held in tasks:
        _receive(holding, held)
    assert calls == ["stop api"]
    holding.remove(tasks[0])
    assert calls == ["stop api"], "3 held: more than half"
    holding.remove(tasks[1])
    assert calls == ["stop api", "resume api"], "2 held: half"


def test_a_start_max_ahead_s_away_stops_the_queue_until_half_that() -> None:
    holding, calls = _holding(max_ahead_s=10.0)
    near, far = _held("api:a", 0), _held("api:b", 0)
    _receive(holding, near)
    _receive(holding, far)
    holding.due_at("api:b", time.monotonic_ns() + 12 * 10**9)
    _receive(holding, _held("api:a", 1))
    assert calls == ["stop api"]
    holding.due_at("api:a", time.monotonic_ns() + 4 * 10**9)
    holding.remove(near)
    assert calls == ["stop api"], "api:b's start is still 12 s away"
    holding.remove(far)  # api:b holds nothing: its start is no longer this worker's
    assert calls == ["stop api", "resume api"]


def test_each_message_looks_at_its_own_bucket_not_at_every_bucket_held(
    monkeypatch: Any,
) -> None:
    """10,000 tenant buckets each holding a task: taking or letting go of one more reads one
    bucket's tasks, however many buckets are held."""
    holding, calls = _holding(max_held=100)
    for n in range(10_000):
        held = _held(f"api:k{n}", 0)
        _receive(holding, held)
        holding.due_at(held.bucket, time.monotonic_ns() + 10**9)
    reads: list[str] = []

    class Counting(dict[str, list[Held]]):
        def get(self, key: Any, default: Any = None) -> Any:
            reads.append(key)
            return super().get(key, default)

        def items(self) -> Any:
            reads.extend(self.keys())
            return super().items()

    holding.held = Counting(holding.held)
    last = _held("api:k9999", 1)
    _receive(holding, last)
    holding.remove(last)
    assert calls == [] and len(reads) <= 8, f"{len(reads)} buckets read"
