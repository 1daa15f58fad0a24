"""PausedTasks alone: tasks held for a paused bucket wake when its pause, and its outer
bucket's, has ended in the store (a MemoryStore on an injected clock, a timer fired by hand)."""

from __future__ import annotations

from celery import Celery

from celery_interval.config import settings_of
from celery_interval.stores.memory import MemoryStore
from celery_interval.worker.held import Held
from celery_interval.worker.pause import PausedTasks
from celery_interval.worker.store.outage import StoreOutage
from tests.helpers.fakeclock import Clock
from tests.helpers.fakes import Timer

TENANT_US = 100_000
OUTER_US = 1_000_000


def _paused_tasks() -> tuple[PausedTasks, MemoryStore, Timer, list[str]]:
    app = Celery("paused", set_as_current=False)
    app.conf.update(
        interval_store_url="memory://",
        interval_queues={
            "api": TENANT_US / 1e6,
            "api:*": {"outer": "acct"},
            "acct": OUTER_US / 1e6,
        },
    )
    settings = settings_of(app)
    store = MemoryStore(Clock(10_000_000_000), nesting=settings.outer_of)
    timer = Timer()
    woken: list[str] = []
    paused = PausedTasks(
        settings,
        store,
        timer,
        StoreOutage(5.0, lambda: 0),
        due=lambda held: woken.append(held.task_id),
    )
    return paused, store, timer, woken


def _held(bucket: str, task_id: str) -> Held:
    return Held(
        request=None,
        bucket=bucket,
        task_id=task_id,
        retries=0,
        queue="api",
        interval_us=TENANT_US,
        not_before_in_us=0,
        holder="w1@test/0",
        acks_late=False,
        release=lambda req: None,
    )


def _poll(timer: Timer) -> None:
    [(_, fn, args)] = timer.entries
    timer.entries.clear()
    fn(*args)


def test_tasks_of_a_tenant_wait_while_its_outer_bucket_is_paused() -> None:
    """A poll that finds the tenant's own record unpaused but its outer bucket paused keeps
    the tasks held (no claim that could only answer PAUSED) and polls again; after the outer's
    unpause the next poll wakes them."""
    paused, store, timer, woken = _paused_tasks()
    store.pause("acct", OUTER_US)
    paused.add(_held("api:acme", "t1"))
    _poll(timer)
    assert woken == [] and len(timer.entries) == 1, "still held, polled again"
    store.unpause("acct", OUTER_US)
    _poll(timer)
    assert woken == ["t1"] and timer.entries == []


def test_tasks_of_a_bucket_wake_when_its_own_pause_ends() -> None:
    paused, store, timer, woken = _paused_tasks()
    store.pause("api:acme", TENANT_US)
    paused.add(_held("api:acme", "t1"))
    _poll(timer)
    assert woken == []
    store.unpause("api:acme", TENANT_US)
    _poll(timer)
    assert woken == ["t1"]
