"""IntervalService alone: a MemoryStore on an injected clock, a timer that fires only when told."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from celery_interval.schedule import ClaimTerms, Outcome, Pace
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.memory import MemoryStore
from celery_interval.worker.held import Held, HeldState
from celery_interval.worker.service import IntervalService
from tests.helpers.fakeclock import Clock
from tests.helpers.fakes import INTERVAL_US, fire_due, held_copy, make_service, run_until
from tests.helpers.logs import worker_log


def run_elsewhere(store: MemoryStore, clock: Clock, task_id: str) -> None:
    """Another worker takes ``task_id``'s slot and holds its lease (the task is running there)."""
    grant = store.grant(TaskCopy("api", task_id, 0), Pace(INTERVAL_US))
    clock.now_us += grant.delay_us
    claim = store.claim(
        TaskCopy("api", task_id, 0),
        INTERVAL_US,
        grant.slot,
        ClaimTerms("w2@test/x", 30_000_000, 12_000),
        ticket=grant.ticket,
    )
    assert claim.outcome.name == "OK"
    clock.now_us += INTERVAL_US


def test_copies_of_tasks_running_elsewhere_do_not_hold_back_this_worker() -> None:
    """Redelivered copies of two tasks leased by another worker, as many as this worker has
    free processes: they take no ticket and no place, so the next task takes the next slot."""
    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    in_pool: list[str] = []
    service = make_service(store, in_pool)
    started: list[str] = []
    run_elsewhere(store, clock, "a")
    run_elsewhere(store, clock, "b")

    copies = {t: held_copy(service, t, started) for t in ("a", "b", "c")}
    for held in copies.values():
        service.receive(held)
    fire_due(service.timer, clock, within_s=0.5)

    assert started == ["c"]
    assert {t: h.state for t, h in copies.items()} == {
        "a": HeldState.HELD_BY_OTHER,
        "b": HeldState.HELD_BY_OTHER,
        "c": HeldState.STARTED,
    }
    assert {t: h.ticket for t, h in copies.items()} == {"a": 0, "b": 0, "c": 3}, (
        "c takes the next ticket; a and b take none (their slots would go unused)"
    )


def test_a_copy_waiting_on_a_lease_is_dropped_once_its_task_is_done() -> None:
    """The copy looks again within a second; the task done elsewhere, it is acked and gone."""
    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    service = make_service(store, [])
    started: list[str] = []
    run_elsewhere(store, clock, "a")
    copy = held_copy(service, "a", started)
    service.receive(copy)
    assert copy.state is HeldState.HELD_BY_OTHER
    (delay_s, fn, args), *_ = service.timer.entries
    assert delay_s <= 1.001

    store.done([TaskCopy("api", "a", 0)], 7_200_000_000)
    service.timer.entries.clear()
    fn(*args)
    assert copy.request.acked and not service.holding.held["api"] and not started


def test_a_task_the_pool_never_accepted_stops_renewing_its_lease_when_the_channel_closes() -> None:
    """Celery drops jobs the pool has not accepted when the channel closes, and never reports
    their end: their leases must lapse (the broker's copy then runs), and the log names them."""
    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    service = make_service(store, [])
    started: list[str] = []
    for task_id in ("a", "b"):
        held = held_copy(service, task_id, started)
        held.acks_late = True
        service.receive(held)
        fire_due(service.timer, clock, within_s=0.5)
    assert started == ["a", "b"]
    service.slots.pool.accepted("a")

    with worker_log() as records:
        service.connection_lost()

    assert list(service.leases.holders) == [("api", "a", 0)], "a runs: its lease is still renewed"
    lines = [r.getMessage() for r in records if "not yet accepted" in r.getMessage()]
    assert len(lines) == 1 and "(b)" in lines[0], lines


def test_a_later_ticket_whose_timer_fires_first_claims_after_the_earlier() -> None:
    """Two tickets armed for about the same claim (after a start admitted again, neighbouring
    tickets wait for the same start): the later one's timer fires first, yet the earlier one
    claims first, and neither is passed and re-ticketed."""
    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    service = make_service(store, [])
    started: list[str] = []
    copies = {t: held_copy(service, t, started) for t in ("a", "b", "c")}
    service.receive(copies["a"])
    run_until(service.timer, clock, lambda: started == ["a"])
    assert started == ["a"]
    service.receive(copies["b"])
    service.receive(copies["c"])

    def entry_of(held: Held) -> tuple[float, Any, tuple[Any, ...]]:
        (entry,) = [e for e in service.timer.entries if e[2] and e[2][0] is held]
        return entry

    late = entry_of(copies["c"])
    service.timer.entries.remove(late)
    clock.now_us += round(late[0] * 1e6)  # c's claim time: its slot is within the lead
    late[1](*late[2])
    assert started == ["a"], "c waits for b, the lower ticket armed here"
    run_until(service.timer, clock, lambda: len(started) == 3)

    assert started == ["a", "b", "c"]
    assert [copies[t].ticket for t in ("a", "b", "c")] == [1, 2, 3]
    assert service.holding.stats["api"].retickets == 0


def test_done_marks_carried_by_a_failed_take_are_sent_later() -> None:
    """A take that fails (an unreachable store, or one that rejects the script) keeps the done
    marks it carried: they go with the next flush, so no acknowledged task loses its mark; the
    task is held and retried, never raised out of the handler."""
    from celery_interval.errors import StoreError, StoreUnavailable
    from celery_interval.schedule import Done

    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    service = make_service(store, [])
    service.mark_done("api", "done-1", 0)
    real_take = store.take

    def failing_take(*args: Any, **kwargs: Any) -> Any:
        raise error

    store.take = failing_take  # type: ignore[method-assign]
    error: Exception = StoreUnavailable("down")
    service.receive(held_copy(service, "t1", []))  # held, retried with backoff
    error = StoreError("rejected")
    service.receive(held_copy(service, "t2", []))  # held, retried with backoff too
    store.take = real_take  # type: ignore[method-assign]
    assert TaskCopy("api", "done-1", 0) in service.done.pending
    service.done.flush()
    assert isinstance(store._marks.get(("api", "done-1", 0)), Done)


def test_each_delivery_gets_its_own_holder_even_across_restarts() -> None:
    clock = Clock(1_000_000_000)
    first, restarted = (make_service(MemoryStore(clock), []) for _ in range(2))
    holders = [s.new_holder() for s in (first, restarted) for _ in range(5000)]
    assert len(set(holders)) == len(holders), "a holder id was given to two deliveries"
    assert all(re.fullmatch(r"w1@test/[0-9a-f]{12}", h) for h in holders), "the audit's format"


def test_a_copy_whose_task_began_here_after_its_grant_is_dropped_at_its_claim() -> None:
    """A copy ticketed before its task's body began here (the broker handed back a message
    whose ack it lost, and the store lost the done mark with its state): its claim is not
    sent, and the copy is acked and dropped, not run a second time."""
    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    service = make_service(store, [])
    started: list[str] = []
    first, copy = held_copy(service, "a", started), held_copy(service, "b", started)
    service.receive(first)
    service.receive(copy)
    assert copy.state is HeldState.GRANTED
    service.done.began(TaskCopy("api", "b", 0))
    fire_due(service.timer, clock, within_s=0.5)
    assert started == ["a"]
    assert copy.request.acked and not service.holding.held["api"]
    assert service.holding.stats["api"].duplicates == 1


def test_a_worker_that_claims_nothing_still_writes_its_marks_to_a_store_born_again() -> None:
    """Its pool processes busy, a worker makes no claim of its own; it reads the store's birth
    marker while bodies that ran here are remembered, and a new birth sends their done marks
    to the store again, so a copy handed to another worker is dropped there."""
    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    service = make_service(store, [])
    started: list[str] = []
    service.receive(held_copy(service, "a", started))
    fire_due(service.timer, clock, within_s=0.5)
    assert started == ["a"]
    service.done.began(TaskCopy("api", "a", 0), ended=True)  # its ack, at its start
    service.mark_done("api", "a", 0)
    fire_due(service.timer, clock, within_s=0.5)
    copy = TaskCopy("api", "a", 0)
    assert store.grant(copy, Pace(INTERVAL_US)).outcome.name == "DUPLICATE"

    births = service.slots.births
    first_birth_us = births.latest_us
    assert first_birth_us is not None
    store.__init__(clock)  # type: ignore[misc]  # restarted empty
    store.grant(TaskCopy("api", "other", 0), Pace(INTERVAL_US))  # another worker's: a birth
    (look,) = [e for e in service.timer.entries if e[1] == births.look]
    assert look[0] == 1.0
    service.timer.entries.remove(look)
    look[1]()
    fire_due(service.timer, clock, within_s=0.5)
    assert store.grant(copy, Pace(INTERVAL_US)).outcome.name == "DUPLICATE"
    # its next claim still carries the first birth, so it opens the settle window for the
    # workers that have not looked yet
    assert births.latest_us == first_birth_us


def test_a_copy_of_what_began_here_is_dropped_as_it_arrives() -> None:
    """Its grant is asked at once (the ledger says what happened to it), before any parking:
    parked, it could reach a worker that does not know it ran, after the store lost its mark;
    the store having lost the mark here, the worker drops it and writes the mark again."""
    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    service = make_service(store, ["busy", "busy"])  # no free process: no ticket now
    started: list[str] = []
    service.done.began(TaskCopy("api", "a", 0), ended=True)
    copy = held_copy(service, "a", started)
    service.receive(copy)
    assert copy.request.acked and not service.holding.held["api"]
    assert service.holding.stats["api"].duplicates == 1
    fire_due(service.timer, clock, within_s=0.5)
    assert started == []
    assert store.grant(TaskCopy("api", "a", 0), Pace(INTERVAL_US)).outcome.name == "DUPLICATE"


class Later:
    """``DoneMarks``' runs on a thread of their own, run when the test says (``run_next``),
    not on a thread; by default only the orphans' later reads (``_read_later``), the births'
    reads off the loop (``_look_off_loop``) when named."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, Any, tuple[Any, ...]]] = []

    def __call__(self, delay_s: float, fn: Any, *args: Any) -> None:
        self.calls.append((delay_s, fn, args))

    def pending(self, name: str = "_read_later") -> list[tuple[float, Any, tuple[Any, ...]]]:
        return [call for call in self.calls if call[1].__name__ == name]

    def run_next(self, name: str = "_read_later") -> float:
        call = self.pending(name)[0]
        self.calls.remove(call)
        delay_s, fn, args = call
        fn(*args)
        return delay_s


def orphans(*task_ids: str) -> tuple[Clock, MemoryStore, IntervalService, Later]:
    """A worker whose tasks ``task_ids`` were released to the pool, then its channel closed."""
    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    service = make_service(store, [])
    later = service.done._later = Later()
    started: list[str] = []
    for task_id in task_ids:
        service.receive(held_copy(service, task_id, started))
        fire_due(service.timer, clock, within_s=0.5)
    assert started == list(task_ids)
    service.timer.entries.clear()
    return clock, store, service, later


def test_a_task_the_pool_never_accepted_is_remembered_once_its_mark_is_found() -> None:
    """A process may have begun it and posted its mark: the worker reads the marks of such
    tasks as the channel closes, then every quarter second until a lease and 1.25 s later,
    and remembers the ones marked, so their marks go again if the store is born again."""
    _clock, store, service, later = orphans("a", "b", "c")
    store.done([TaskCopy("api", "a", 0)], 7_200_000_000)  # a's process posted its mark
    service.connection_lost()
    assert service.done.began_here(TaskCopy("api", "a", 0)), "read as the channel closed"
    store.done([TaskCopy("api", "b", 0)], 7_200_000_000)  # b's process posted its mark
    assert later.run_next() == 0.25
    assert [service.done.began_here(TaskCopy("api", t, 0)) for t in "abc"] == [True, True, False]
    reads = round((service.settings.lease_us / 1e6 + 1.25) / 0.25)
    for _ in range(reads - 2):
        assert later.run_next() == 0.25
    store.done([TaskCopy("api", "c", 0)], 7_200_000_000)  # c's began just before the last
    assert later.run_next() == 0.25
    assert service.done.began_here(TaskCopy("api", "c", 0))
    assert not later.pending(), "every copy was found"


def test_a_mark_posted_between_reads_then_lost_with_the_store_still_goes_again() -> None:
    """A process held in a claim began the task 2.9 s after the channel closed and posted its
    mark; the store lost its state 0.6 s later. The read a quarter second after the post
    found it, so the worker writes it again at the store's birth and the copy is dropped."""
    clock, store, service, later = orphans("a")
    service.connection_lost()
    for _ in range(11):  # 2.75 s of reads find nothing
        assert later.run_next() == 0.25
    store.done([TaskCopy("api", "a", 0)], 7_200_000_000)  # the body begins, mark posted
    later.run_next()
    store._marks.clear()  # the store loses its state
    assert service.done.write_again(clock() + 1) == 1
    fire_due(service.timer, clock, within_s=0.5)  # the marks' flush
    copy = store.grant(TaskCopy("api", "a", 0), Pace(INTERVAL_US))
    assert copy.outcome is Outcome.DUPLICATE


def test_an_unreported_task_whose_mark_is_in_the_store_is_remembered_before_a_reconnect() -> None:
    """Celery runs no timer while it reconnects to the broker: a store that loses its state
    meanwhile must not take the only trace of a body that began here. The mark is read as the
    channel closes, so it goes again to the store born again, and a copy handed back is
    dropped here."""
    clock, store, service, later = orphans("a")
    store.done([TaskCopy("api", "a", 0)], 7_200_000_000)  # its process posted the mark
    service.connection_lost()  # the pool never reported it: released, not accepted
    store._marks.clear()  # the store loses its marks before the loop runs again
    assert not later.pending(), "found at once"
    assert service.done.began_here(TaskCopy("api", "a", 0))
    assert service.done.write_again(clock() + 1) == 1, "its mark goes again to the new store"


def test_a_mark_posted_after_the_channel_closed_is_read_while_the_loop_waits() -> None:
    """The body began just after the channel closed (its process was handed it before): the
    read a quarter second later, on its own thread, finds the mark while Celery reconnects;
    the loop takes it when it runs again, and a birth seen meanwhile sends the mark again."""
    clock, store, service, later = orphans("a", "b")
    service.connection_lost()
    store.done([TaskCopy("api", "a", 0), TaskCopy("api", "b", 0)], 7_200_000_000)
    later.run_next()  # on its thread, during the reconnect: both found
    store._marks.clear()  # then the store loses its state
    assert service.done.write_again(clock() + 1) == 2, "both marks go again"
    assert service.done.began_here(TaskCopy("api", "a", 0))
    assert not later.pending()


def test_a_worker_reconnecting_to_the_broker_writes_its_marks_to_a_store_born_again() -> None:
    """A body ended here, then the channel closed; while Celery reconnects (no timer runs) the
    store loses its state: the worker reads the birth marker on a thread of its own and posts
    the mark from there, so a copy of the task that reaches another worker is dropped."""
    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    service = make_service(store, [])
    started: list[str] = []
    service.receive(held_copy(service, "a", started))
    fire_due(service.timer, clock, within_s=0.5)
    service.done.began(TaskCopy("api", "a", 0), ended=True)
    service.mark_done("api", "a", 0)
    fire_due(service.timer, clock, within_s=0.5)
    service.slots.births.saw(store.born_us())  # the birth its claims knew
    later = service.done._later = Later()
    service.connection_lost()
    clock.now_us += 10_000_000
    store.__init__(clock)  # type: ignore[misc]  # the store loses everything
    store.grant(TaskCopy("api", "other", 0), Pace(INTERVAL_US))  # and is born again
    assert later.pending("_look_off_loop"), "no read of the birth marker off the loop"
    later.run_next("_look_off_loop")
    granted = store.grant(TaskCopy("api", "a", 0), Pace(INTERVAL_US))
    assert granted.outcome is Outcome.DUPLICATE, granted


def test_an_unaccepted_tasks_mark_is_read_before_celery_restores_the_lost_channel() -> None:
    """Celery restores a broken channel's messages (seconds) before the consumer stops: the
    marks of what the pool was handed are read as the channel breaks, so a store that loses
    its state during that restore does not take the only trace of a body that began here;
    Celery calls the service first (the bootstep wraps its handler)."""
    from types import SimpleNamespace

    from celery_interval.worker.bootstep import _read_before_collect

    clock, store, service, _later = orphans("a")
    store.done([TaskCopy("api", "a", 0)], 7_200_000_000)  # its process posted the mark
    calls: list[str] = []
    consumer: Any = SimpleNamespace(
        interval_service=service,
        on_connection_error_after_connected=lambda exc: calls.append("collect"),
    )
    _read_before_collect(consumer)
    consumer.on_connection_error_after_connected(ConnectionError("gone"))
    assert calls == ["collect"]
    store._marks.clear()  # the store loses its marks while Celery restores the messages
    service.connection_lost()
    assert service.done.began_here(TaskCopy("api", "a", 0)), "read before the restore"
    assert service.done.write_again(clock() + 1) == 1, "its mark goes again to the new store"


def test_the_ack_of_a_dropped_copy_leaves_the_body_that_ran_here_remembered_as_ended() -> None:
    """A copy of a task whose body ran and ended here is dropped as it arrives; its ack (as
    Celery's acknowledge runs it) records nothing, so the store born again still gets the
    body's mark and a copy handed to another worker is dropped there."""
    from types import SimpleNamespace

    from celery_interval.worker.acks import track_ack

    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    service = make_service(store, [])
    copy = TaskCopy("api", "a", 0)
    service.done.began(copy, ended=True)  # its body ran here and ended
    held = held_copy(service, "a", [])
    req = held.request
    req.on_ack = lambda *a, **k: None  # type: ignore[attr-defined]
    req.on_reject = lambda *a, **k: None  # type: ignore[attr-defined]
    req.message = SimpleNamespace(delivery_tag="t-a", acknowledged=True)  # type: ignore[attr-defined]
    track_ack(req, service, held.copy, acks_late=False)
    service.receive(held)
    assert req.acked and service.holding.stats["api"].duplicates == 1
    req._on_ack()  # type: ignore[attr-defined]  # Celery's acknowledge calls it
    fire_due(service.timer, clock, within_s=0.5)
    assert service.done.write_again(clock() + 1) == 1, "its mark goes again to the new store"


def test_a_redelivered_copy_whose_mark_the_store_holds_is_dropped_as_it_arrives() -> None:
    """Its mark is read as it arrives, and its grant asked at once, which drops it: held or
    parked meanwhile, the copy could outlive the store's state (and its mark). A throttled
    task's copy sent again is not read: it runs."""
    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    service = make_service(store, ["busy", "busy"])  # no free process: no ticket now
    started: list[str] = []
    store.done([TaskCopy("api", "a", 0)], 7_200_000_000)
    copy = held_copy(service, "a", started)
    copy.request.delivery_info = {"redelivered": True}  # type: ignore[attr-defined]
    service.receive(copy)
    assert copy.request.acked and service.holding.stats["api"].duplicates == 1
    assert not service.holding.held["api"]


def test_a_stale_copy_of_a_throttled_run_writes_no_mark_for_the_copy_sent_again() -> None:
    """A body began here and was throttled (its copy sent again must run); a stale copy of the
    same message (parked twice across a broker restart) comes back here: it is dropped, and
    no done mark is written, which would drop the copy sent again as done."""
    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    service = make_service(store, [])
    started: list[str] = []
    service.done.began(TaskCopy("api", "a", 0), ended=False)  # accepted, then throttled
    stale = held_copy(service, "a", started)
    service.receive(stale)
    fire_due(service.timer, clock, within_s=0.5)
    assert stale.request.acked and started == []
    assert store.grant(TaskCopy("api", "a", 0), Pace(INTERVAL_US)).outcome.name == "OK"


def test_a_stale_copy_of_a_throttled_orphan_leaves_the_copy_sent_again_running() -> None:
    """A body released as the channel broke began (its mark was read: remembered as ended)
    and was throttled; the copy sent again holds the task's lease in the store when a stale
    copy of the old message comes back here: it is dropped, and no done mark is written,
    which would drop the copy sent again as done when it claims again."""
    from celery_interval.schedule import Lease

    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    service = make_service(store, [])
    started: list[str] = []
    copy = TaskCopy("api", "a", 0)
    service.done.began(copy, ended=True)  # its mark was found as the channel broke
    granted = store.grant(copy, Pace(INTERVAL_US))
    terms = ClaimTerms("w2@test/again", 30_000_000, 12_000)
    clock.now_us = granted.slot.slot_us
    assert store.claim(copy, INTERVAL_US, granted.slot, terms).outcome is Outcome.OK
    stale = held_copy(service, "a", started)
    service.receive(stale)
    fire_due(service.timer, clock, within_s=0.5)
    assert stale.request.acked and started == []
    assert isinstance(store.read_mark("api", "a", 0), Lease), "no done mark over its lease"


@pytest.mark.parametrize("sent_plain", [True, False])
def test_a_throttled_run_sent_again_as_a_plain_copy_runs_again_here(sent_plain: bool) -> None:
    """A body was throttled with the store failing: its copy went again as a plain message
    (no resend header, same retries). Back on this worker, that copy runs: the memory of the
    body that began here is dropped as the body ends. A throttle whose place was kept leaves
    the memory, so a stale copy of the old message is still dropped."""
    from celery_interval.worker.acks import BEGAN_KEY, SENT_PLAIN, THROTTLED_KEY, body_ended

    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    service = make_service(store, [])
    started: list[str] = []
    service.receive(held_copy(service, "a", started))
    fire_due(service.timer, clock, within_s=0.5)
    assert started == ["a"]
    copy = TaskCopy("api", "a", 0)
    first = held_copy(service, "a", started).request
    service.done.began(copy, ended=False)
    first.request_dict.update({BEGAN_KEY: copy, THROTTLED_KEY: SENT_PLAIN if sent_plain else True})
    body_ended(service, first)
    again = held_copy(service, "a", started)
    service.receive(again)
    fire_due(service.timer, clock, within_s=0.5)
    assert again.request.acked is not sent_plain  # dropped as begun here, or waits its turn
    run_until(service.timer, clock, lambda: len(started) > 1 or clock.now_us > 1_100_000_000)
    assert started == (["a", "a"] if sent_plain else ["a"])


def _reached_late(service: IntervalService, held: Held) -> Any:
    """``held`` was started, and its pool process reached it past its start: Celery's ack of
    the accepted task waits for the body's end (``track_ack``)."""
    from types import SimpleNamespace

    from celery_interval.headers import START_HEADER
    from celery_interval.worker.acks import ACK_AT_END_KEY, track_ack

    req = held.request
    req.on_ack = lambda *a, **k: req.acknowledge()  # type: ignore[attr-defined]
    req.on_reject = lambda *a, **k: None  # type: ignore[attr-defined]
    req.message = SimpleNamespace(delivery_tag="t-" + held.task_id, acknowledged=False)  # type: ignore[attr-defined]
    req.request_dict["id"] = held.task_id
    track_ack(req, service, held.copy, acks_late=False)
    service.slots.pool.accepted(held.task_id)
    req.request_dict[START_HEADER] = time.monotonic_ns() - 10**9  # a second late
    req._on_ack()  # type: ignore[attr-defined]
    assert ACK_AT_END_KEY in req.request_dict and not req.acked
    return req


def test_a_body_whose_ack_waits_for_its_end_is_remembered_as_the_channel_breaks() -> None:
    """A pool process reached its task late, so the ack waits for the body's end; its mark was
    posted as the body began. The channel breaks, the body ends while Celery reconnects (no
    loop runs, the end is not reported), and the store loses its state: the worker, reading
    the birth on a thread of its own, posts the mark again, so the copy the broker gives back
    is dropped wherever it goes. Its end, reported later, takes no mark it should not."""
    from celery_interval.worker.acks import body_ended

    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    service = make_service(store, [])
    later = service.done._later = Later()
    started: list[str] = []
    held = held_copy(service, "a", started)
    service.receive(held)
    fire_due(service.timer, clock, within_s=0.5)
    assert started == ["a"]
    service.slots.births.saw(store.born_us())
    req = _reached_late(service, held)
    store.done([held.copy], 7_200_000_000)  # its process posted the mark as the body began

    service.connection_breaking()
    service.connection_lost()
    clock.now_us += 13_000_000
    store.__init__(clock)  # type: ignore[misc]  # the store loses everything
    store.grant(TaskCopy("api", "other", 0), Pace(INTERVAL_US))  # and is born again
    for _ in later.pending("_look_off_loop"):  # the birth read on its thread, if it reads
        later.run_next("_look_off_loop")

    granted = store.grant(held.copy, Pace(INTERVAL_US))
    assert granted.outcome is Outcome.DUPLICATE, "the copy given back runs nowhere"
    body_ended(service, req)
    assert service.done.acks_waiting == {}


def test_a_late_body_read_as_the_channel_broke_then_throttled_is_forgotten_as_it_ends() -> None:
    """The mark read as the channel broke made the worker remember the body; the body was then
    throttled and its copy went again as a plain message: as its end is reported, the memory
    goes, so that copy runs here too."""
    from celery_interval.worker.acks import SENT_PLAIN, THROTTLED_KEY, body_ended

    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    service = make_service(store, [])
    service.done._later = Later()
    started: list[str] = []
    held = held_copy(service, "a", started)
    service.receive(held)
    fire_due(service.timer, clock, within_s=0.5)
    req = _reached_late(service, held)
    store.done([held.copy], 7_200_000_000)
    service.connection_breaking()
    service.connection_lost()
    assert service.done.began_here(held.copy), "read as the channel broke"
    req.request_dict[THROTTLED_KEY] = SENT_PLAIN
    body_ended(service, req)
    assert not service.done.began_here(held.copy)


def test_a_mark_found_off_the_loop_goes_again_from_the_thread_that_reads_a_birth() -> None:
    """The later read (on its thread) found the mark of a body released as the channel broke;
    the loop, still down, has not taken it yet when the store is born again: the birth read
    on its thread posts that mark too."""
    from celery_interval.schedule import Done

    clock, store, service, later = orphans("a")
    service.connection_lost()
    store.done([TaskCopy("api", "a", 0)], 7_200_000_000)  # its process posted the mark late
    later.run_next()  # found, not yet taken by the loop
    store._marks.clear()  # the store loses its state
    assert service.done.write_again_now(clock() + 1) == 1
    assert isinstance(store.read_mark("api", "a", 0), Done)
