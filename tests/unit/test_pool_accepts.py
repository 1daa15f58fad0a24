"""A threads pool accepts tasks on its own thread while the loop takes the unaccepted ones."""

from __future__ import annotations

import sys
import threading
from typing import Any

from celery_interval.stores.memory import MemoryStore
from celery_interval.worker.pool import Pool
from tests.helpers.fakeclock import Clock
from tests.helpers.fakes import Timer, fire_due, held_copy, make_service

ROUNDS = 200
TASKS = 50


def test_each_task_is_accepted_or_taken_for_orphaned_and_a_late_accept_counts_again() -> None:
    """The executor thread accepts every task (a threads pool runs all it was given) while the
    loop thread takes the unaccepted ones, round after round: a task taken for orphaned and
    accepted after is handed back (its lease is renewed again), and the count of running
    tasks ends at every task, never below."""
    service = make_service(MemoryStore(Clock(1_000_000_000)), [])
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows
    try:
        for n in range(ROUNDS):
            pool = Pool(Timer(), lambda: 1, claim=lambda held: None)
            helds = [held_copy(service, f"r{n}-t{i}", []) for i in range(TASKS)]
            for held in helds:
                pool.handed(held)
            late: list[Any] = []
            go = threading.Event()
            executor = threading.Thread(target=accept_all, args=(pool, helds, late, go))
            executor.start()
            go.set()
            orphans = pool.take_unaccepted()
            executor.join()
            assert {h.request.id for h in late} == {h.request.id for h in orphans}, (
                f"round {n}: a task taken for orphaned ran without being handed back"
            )
            assert pool.in_pool == TASKS, f"round {n}: {pool.in_pool} running of {TASKS}"
    finally:
        sys.setswitchinterval(interval)


def accept_all(pool: Pool, helds: list[Any], late: list[Any], go: threading.Event) -> None:
    """The executor thread: accept every task, keeping those handed back."""
    go.wait()
    for held in helds:
        again = pool.accepted(held.request.id)
        if again is not None:
            late.append(again)


def test_a_task_accepted_after_the_channel_closed_renews_its_lease_again() -> None:
    from celery_interval.worker.strategy import _accepted

    clock = Clock(1_000_000_000)
    service = make_service(MemoryStore(clock), [])
    started: list[str] = []
    held = held_copy(service, "a", started)
    held.acks_late = True
    service.receive(held)
    fire_due(service.timer, clock, within_s=0.5)
    assert started == ["a"]
    service.connection_lost()
    assert not service.leases.holders, "taken for orphaned: its lease lapses"
    _accepted(service, "a")  # the threads pool runs it after all
    assert list(service.leases.holders) == [("api", "a", 0)]
    assert service.slots.pool.in_pool == 1
