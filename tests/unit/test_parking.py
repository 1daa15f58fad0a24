"""Parking alone: which tasks park, in what order they come back, and what a failure does."""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery import Celery

from celery_interval.buckets import overflow_queue_name
from celery_interval.config import settings_of
from celery_interval.errors import StoreUnavailable
from celery_interval.stores.overflow import MemoryOverflowIndex
from celery_interval.worker.broker.parking import TAKEN_LEASE_US, Parking
from tests.helpers.fakes import Qos, Timer

INTERVAL_S = 0.02
HOLD_AHEAD_S = 0.1  # a cap of 5 tasks per bucket at 20 ms
CAP = 5


@dataclass
class Message:
    task_id: str
    bucket: str
    log: list[tuple[str, str]]
    acknowledged: bool = False

    @property
    def body(self) -> str:  # a directory entry's JSON
        return self.task_id

    def ack(self) -> None:
        self.acknowledged = True
        self.log.append(("ack", self.task_id))

    def requeue(self) -> None:
        self.acknowledged = True  # settled: the broker holds it again
        self.log.append(("requeue", self.task_id))
        self.back(self)

    #: Put back at the head of the queue it was taken from (set by ``Broker.get``).
    back: Any = None


@dataclass
class Request:
    message: Message


@dataclass
class FakeHeld:
    task_id: str
    bucket: str
    request: Request
    queue: str = "api"
    interval_us: int = round(INTERVAL_S * 1e6)
    unparked: bool = False


@dataclass
class Broker:
    """Overflow queues as deques; records publishes and acks in one log."""

    log: list[tuple[str, str]] = field(default_factory=list)
    queues: dict[str, deque[Message]] = field(default_factory=lambda: defaultdict(deque))
    delivered: list[tuple[str, str]] = field(default_factory=list)
    fail: bool = False
    #: The worker's task handler: a message taken back is held there.
    on_deliver: Any = None

    #: Confirms the test gives by hand (``settle``), as an AMQP broker's arrive later.
    confirm_later: bool = False
    unconfirmed: list[Any] = field(default_factory=list)

    def publish(self, copies: list[tuple[str, Any, str]], settled: Any) -> None:
        if self.fail:
            raise ConnectionError("broker refused")
        for name, message, _origin in copies:
            self.queues[name].append(Message(message.task_id, message.bucket, self.log))
            self.log.append(("publish", message.task_id))
        if self.confirm_later:
            self.unconfirmed.append(settled)
        else:
            settled(None)

    directory: deque[Message] = field(default_factory=deque)

    def register(self, entries: list[str]) -> None:
        for entry in entries:
            self.directory.append(Message(entry, "", self.log))

    def take_entry(self) -> Any:
        if not self.directory:
            return None
        message = self.directory.popleft()
        message.back = self.directory.appendleft
        return message

    def depth(self, name: str) -> int:
        return len(self.queues[name])

    def settle(self, refused: Exception | None = None) -> None:
        """The broker's confirm (or nack) of every batch published so far arrives."""
        for settled in self.unconfirmed:
            settled(refused)
        self.unconfirmed.clear()

    #: Messages taken from a queue and not acked: they go back to its head on ``close``.
    unacked: list[tuple[str, Message]] = field(default_factory=list)

    def get(self, name: str) -> Any:
        if not self.queues[name]:
            return None
        message = self.queues[name].popleft()
        self.unacked.append((name, message))
        message.back = self.queues[name].appendleft
        return message

    def deliver(self, message: Any, queue: str) -> None:
        self.delivered.append((queue, message.task_id))
        self.on_deliver(message)

    def consumes(self, queue: str) -> bool:
        return True

    def returns_unacked_within_s(self) -> float:
        return 0.0

    def close(self) -> None:
        for name, message in reversed(self.unacked):
            if not message.acknowledged:
                self.queues[name].appendleft(message)
        self.unacked.clear()


class FlakyIndex(MemoryOverflowIndex):
    down = False
    #: Added to the index's clock: a test moves time past a hold.
    later_us = 0

    def _now_us(self) -> int:  # type: ignore[override]
        return super()._now_us() + self.later_us

    def park(self, members: list[tuple[str, str]]) -> None:
        if self.down:
            raise StoreUnavailable("store down")
        super().park(members)

    def forget_all(self) -> None:
        """The store restarted empty."""
        self.__init__()  # type: ignore[misc]

    def size(self) -> int:
        if self.down:
            raise StoreUnavailable("store down")
        return super().size()

    #: Only ``hold`` fails: the store went away between a refill's get and its hold.
    hold_down = False

    def hold(self, members: list[tuple[str, str]], in_us: int) -> None:
        if self.down or self.hold_down:
            raise StoreUnavailable("store down")
        super().hold(members, in_us)


class Counts(defaultdict[str, int]):
    """The worker's held tasks by bucket, as parking reads them."""

    def __init__(self) -> None:
        super().__init__(int)

    def held_in(self, bucket: str) -> int:
        return self[bucket]

    def held_total(self) -> int:
        return sum(self.values())


@dataclass
class Rig:
    parking: Parking
    broker: Broker
    index: FlakyIndex
    timer: Timer
    counts: Counts
    held: list[FakeHeld]
    qos: Qos

    def arrive(self, task_id: str, bucket: str = "api:a") -> FakeHeld:
        """A message arrives: parked, or held here (counted in its bucket)."""
        held = FakeHeld(task_id, bucket, Request(Message(task_id, bucket, self.broker.log)))
        if not self.parking.parks(held):
            self.hold(held)
        return held

    def hold(self, held: FakeHeld) -> None:
        self.held.append(held)
        self.counts[held.bucket] += 1

    def leave(self, bucket: str = "api:a") -> None:
        self.counts[bucket] -= 1
        self.parking.left("api", bucket)


@pytest.fixture
def rig() -> Rig:
    app = Celery("overflow", set_as_current=False)
    app.conf.update(
        interval_store_url="memory://",
        interval_queues={"api": INTERVAL_S},
        interval_hold_ahead_s=HOLD_AHEAD_S,
        interval_max_held_total=12,
    )
    counts = Counts()
    held: list[FakeHeld] = []
    timer, broker, index, qos = Timer(), Broker(), FlakyIndex(), Qos()
    rig = Rig(None, broker, index, timer, counts, held, qos)  # type: ignore[arg-type]
    rig.parking = Parking(
        settings_of(app),
        index,
        timer,
        counts,
        hold=rig.hold,
        qos=lambda: qos,
    )
    broker.on_deliver = lambda m: rig.hold(FakeHeld(m.task_id, m.bucket, Request(m), unparked=True))
    rig.parking.start(broker)
    return rig


def test_a_bucket_holds_its_cap_and_parks_the_rest_in_order(rig: Rig) -> None:
    for i in range(CAP + 3):
        rig.arrive(f"t{i}")
    assert [h.task_id for h in rig.held] == [f"t{i}" for i in range(CAP)]
    assert rig.qos.value == 3, "parked messages stay unacked until parked: prefetch makes room"
    rig.timer.run()
    name = overflow_queue_name("api", "api:a")
    assert [m.task_id for m in rig.broker.queues[name]] == [f"t{i}" for i in range(CAP, CAP + 3)]
    # Each copy is published before its original is acked (a kill in between leaves both).
    for task_id in ("t5", "t6", "t7"):
        assert rig.broker.log.index(("publish", task_id)) < rig.broker.log.index(("ack", task_id))
    assert rig.qos.value == 0
    assert [(p.queue, p.bucket) for p in rig.index.due(10)] == [("api", "api:a")]


def test_arrivals_follow_parked_tasks_and_come_back_in_order(rig: Rig) -> None:
    for i in range(CAP + 2):
        rig.arrive(f"t{i}")
    rig.timer.run()
    rig.leave()
    rig.leave()
    rig.arrive("t7")  # room here, but the bucket has parked tasks: it goes behind them
    rig.timer.run()
    assert [m for _, m in rig.broker.delivered] == ["t5", "t6"]
    name = overflow_queue_name("api", "api:a")
    assert [m.task_id for m in rig.broker.queues[name]] == ["t7"]


def take_back_the_parked(rig: Rig, parked: int = 1) -> None:
    """``parked`` tasks more than the cap park; enough leave that the refill takes them all
    back and finds the overflow queue empty."""
    for i in range(CAP + parked):
        rig.arrive(f"t{i}")
    rig.timer.run()
    for _ in range(2 + parked):
        rig.leave()
    rig.timer.run()


def test_an_empty_overflow_unlists_its_bucket(rig: Rig) -> None:
    take_back_the_parked(rig)
    assert [m for _, m in rig.broker.delivered] == ["t5"]
    assert rig.index.size() == 1, "listed while the task taken back is unacked"
    rig.held[-1].request.message.ack()
    rig.leave()
    rig.timer.run()
    assert rig.index.size() == 1, "listed until the hold ends"
    rig.index.later_us = TAKEN_LEASE_US
    rig.leave()
    rig.timer.run()
    assert rig.index.size() == 0 and not rig.parking.known
    rig.arrive("t6")
    assert rig.held[-1].task_id == "t6", "an unlisted bucket with room holds again"


def test_a_park_between_a_refills_read_and_its_empty_get_keeps_the_bucket_listed(
    rig: Rig,
) -> None:
    rig.index.park([("api", "api:a")])
    seen = rig.index.changes("api", "api:a")
    rig.index.park([("api", "api:a")])  # another worker parks meanwhile
    assert rig.parking.refill("api", "api:a", seen) == 0
    assert rig.index.size() == 1
    assert rig.parking.refill("api", "api:a", rig.index.changes("api", "api:a")) == 0
    assert rig.index.size() == 0


def test_taken_back_tasks_never_park_again(rig: Rig) -> None:
    for i in range(CAP):
        rig.arrive(f"t{i}")
    message = Message("back", "api:a", rig.broker.log)
    held = FakeHeld("back", "api:a", Request(message), unparked=True)
    assert not rig.parking.parks(held)


def test_the_worker_wide_cap_parks_every_bucket(rig: Rig) -> None:
    for bucket in ("api:a", "api:b", "api:c"):
        for i in range(4):
            rig.arrive(f"{bucket}-{i}", bucket)
    assert sum(rig.counts.values()) == 12
    rig.arrive("api:d-0", "api:d")
    assert rig.counts["api:d"] == 0, "past max_held_total a new bucket parks too"


def test_a_refill_whose_hold_meets_a_store_outage_puts_its_message_back(rig: Rig) -> None:
    """The store goes away between a refill's first get and its hold: the message taken goes
    back to the head of its overflow queue (not left unacked until the broker's visibility
    timeout), and the refill after the outage takes it back in order."""
    for i in range(CAP + 2):
        rig.arrive(f"t{i}")
    rig.timer.run()
    name = overflow_queue_name("api", "api:a")
    rig.index.hold_down = True
    for _ in range(3):  # down to half the cap: a refill is wanted
        rig.leave()
    rig.timer.run()
    assert rig.broker.unacked, "the refill took a message: nothing was tested"
    assert rig.broker.delivered == []
    assert [m.task_id for m in rig.broker.queues[name]] == ["t5", "t6"], "the message is back"
    rig.index.hold_down = False
    rig.parking.refill("api", "api:a", None)
    assert [m for _, m in rig.broker.delivered] == ["t5", "t6"]


def test_a_failed_park_holds_the_batch_and_parking_resumes_with_the_store(rig: Rig) -> None:
    for i in range(CAP + 2):
        rig.arrive(f"t{i}")
    rig.index.down = True
    rig.timer.run()
    assert [h.task_id for h in rig.held][-2:] == ["t5", "t6"], "held here, not lost"
    assert all(h.unparked for h in rig.held[-2:])
    assert not rig.parking.active
    rig.arrive("t7")
    assert rig.held[-1].task_id == "t7", "no parking while it fails: the cap stops fetching"
    rig.parking.poll()
    assert not rig.parking.active
    rig.index.down = False
    rig.parking.poll()
    assert rig.parking.active
    rig.arrive("t8")
    assert rig.held[-1].task_id == "t7" and rig.parking._pending, "parks again"


def test_a_broker_that_refuses_holds_the_batch(rig: Rig) -> None:
    rig.broker.fail = True
    for i in range(CAP + 1):
        rig.arrive(f"t{i}")
    rig.timer.run()
    assert [h.task_id for h in rig.held] == [f"t{i}" for i in range(CAP + 1)]
    assert ("ack", "t5") not in rig.broker.log


def test_overflow_queue_names_are_readable_and_bounded() -> None:
    assert overflow_queue_name("api", "api:shop-1") == "ci-overflow:api:shop-1"
    assert overflow_queue_name("api", "api") == "ci-overflow:api"
    assert overflow_queue_name("api", "other") == "ci-overflow:api:other"
    long_a = overflow_queue_name("api", "api:" + "x" * 300 + "a")
    long_b = overflow_queue_name("api", "api:" + "x" * 300 + "b")
    assert len(long_a.encode()) <= 200 and long_a != long_b


def test_a_bucket_holds_about_hold_ahead_s_of_its_pace(rig: Rig) -> None:
    assert rig.parking.cap(20_000) == CAP
    assert rig.parking.cap(1_000) == round(HOLD_AHEAD_S * 1e6 / 1_000)
    assert rig.parking.cap(60_000_000) == 1, "a long interval holds one: the next comes back"
    assert rig.parking.cap(1) == 400, "interval_max_held caps it"


def test_tasks_taken_back_return_with_the_connection_and_their_bucket_stays_listed(
    rig: Rig,
) -> None:
    """A refill empties the overflow queue; the connection goes before the tasks it took back
    are acked: they return to that queue, and the bucket is still listed (due once the worker
    is back; due within the lease if it is not), so no task is stranded there."""
    take_back_the_parked(rig, parked=2)
    name = overflow_queue_name("api", "api:a")
    assert [m for _, m in rig.broker.delivered] == ["t5", "t6"] and not rig.broker.queues[name]
    assert [(p.queue, p.bucket) for p in rig.index.due(10)] == [], "not due: taken, unacked"
    rig.parking.stop()
    assert [m.task_id for m in rig.broker.queues[name]] == ["t5", "t6"]
    assert rig.index.size() == 1
    rig.parking.start(rig.broker)
    assert [(p.queue, p.bucket) for p in rig.index.due(10)] == [("api", "api:a")]
    rig.parking.poll()
    assert [m for _, m in rig.broker.delivered] == ["t5", "t6", "t5", "t6"]


def test_another_workers_refill_does_not_unlist_a_bucket_whose_tasks_are_held(rig: Rig) -> None:
    """Worker A took back the last parked task; B finds the queue empty: the bucket stays
    listed (due when A's hold ends), so if A dies its task is found when it returns."""
    take_back_the_parked(rig)
    changes = rig.index.changes("api", "api:a")
    assert not rig.index.drop_if("api", "api:a", changes), "B dropped a held bucket"
    assert rig.index.size() == 1 and not rig.index.due(10)
    rig.index.later_us = TAKEN_LEASE_US
    assert [p.bucket for p in rig.index.due(10)] == ["api:a"], "due when the hold ends"


def test_a_task_the_handler_fails_on_goes_back_to_the_head_of_its_overflow(rig: Rig) -> None:
    """The task handler raises on a task taken back: it returns to the head of its overflow
    queue (not left unacked on the channel), and the next refill takes it back in order."""
    for i in range(CAP + 2):
        rig.arrive(f"t{i}")
    rig.timer.run()
    name = overflow_queue_name("api", "api:a")
    hold = rig.broker.on_deliver

    def failing(message: Any) -> None:
        raise RuntimeError("handler failed")

    rig.broker.on_deliver = failing
    for _ in range(3):
        rig.leave()
    rig.timer.run()
    assert [m.task_id for m in rig.broker.queues[name]] == ["t5", "t6"], "put back, in order"
    assert not rig.parking._taken, "nothing counted as taken"
    rig.broker.on_deliver = hold
    rig.parking.refill("api", "api:a", None)
    assert [h.task_id for h in rig.held if h.unparked] == ["t5", "t6"]


def test_an_ack_refused_mid_batch_still_acks_and_counts_the_rest(rig: Rig) -> None:
    """One original's ack fails (the connection went): the rest of the batch is still acked,
    the prefetch balanced, and the bucket's refill wanted."""
    for i in range(CAP + 3):
        rig.arrive(f"t{i}")
    refused = next(h for h in rig.parking._pending if h.task_id == "t6")

    def broken_ack() -> None:
        raise ConnectionError("connection lost")

    refused.request.message.ack = broken_ack  # type: ignore[method-assign]
    rig.timer.run()
    assert ("ack", "t5") in rig.broker.log and ("ack", "t7") in rig.broker.log
    assert rig.qos.value == 0
    assert rig.parking.parked == 3


def test_originals_are_acked_when_the_broker_confirms_their_copies(rig: Rig) -> None:
    """Parking never waits for the broker: the originals stay unacked (and counted in the
    prefetch) until the confirm arrives, then are acked and the bucket refilled."""
    rig.broker.confirm_later = True
    for i in range(CAP + 2):
        rig.arrive(f"t{i}")
    rig.timer.run()
    assert ("publish", "t5") in rig.broker.log and ("ack", "t5") not in rig.broker.log
    assert rig.qos.value == 2 and rig.parking.parked == 0
    rig.broker.settle()
    assert ("ack", "t5") in rig.broker.log and ("ack", "t6") in rig.broker.log
    assert rig.qos.value == 0 and rig.parking.parked == 2


def test_a_bucket_is_in_the_directory_before_any_copy_is_published(rig: Rig) -> None:
    """A worker killed once its originals are acked leaves copies only the directory and the
    store's index know of: both list the bucket before the copies go out (a store that then
    loses its index, as a restart does, leaves the directory)."""
    rig.broker.confirm_later = True
    for i in range(CAP + 2):
        rig.arrive(f"t{i}")
    rig.timer.run()
    assert ("publish", "t5") in rig.broker.log and ("ack", "t5") not in rig.broker.log
    assert len(rig.broker.directory) == 1, "listed in the directory before its confirm"
    rig.broker.settle()
    assert ("ack", "t5") in rig.broker.log and len(rig.broker.directory) == 1


def test_a_batch_the_broker_refuses_is_held_here(rig: Rig) -> None:
    """A nack: the broker took no copy, so the batch is held here (not acked, not lost)."""
    rig.broker.confirm_later = True
    for i in range(CAP + 2):
        rig.arrive(f"t{i}")
    rig.timer.run()
    rig.broker.settle(RuntimeError("basic.nack"))
    assert [h.task_id for h in rig.held][-2:] == ["t5", "t6"]
    assert ("ack", "t5") not in rig.broker.log and rig.qos.value == 0


def test_a_connection_lost_before_the_confirm_leaves_the_originals_to_the_broker(
    rig: Rig,
) -> None:
    """The connection goes with copies unconfirmed: their originals are neither acked nor held
    here (the broker returns them; a copy that landed is dropped as a duplicate), and a confirm
    for the old channel that still arrives changes nothing."""
    rig.broker.confirm_later = True
    for i in range(CAP + 2):
        rig.arrive(f"t{i}")
    rig.timer.run()
    rig.parking.stop()
    assert rig.qos.value == 0
    rig.broker.settle()
    assert ("ack", "t5") not in rig.broker.log
    assert [h.task_id for h in rig.held] == [f"t{i}" for i in range(CAP)]


def test_parked_tasks_the_store_forgot_are_found_through_the_directory(rig: Rig) -> None:
    """The worker that parked a bucket's tasks is gone and the store lost its index: another
    worker's sweep of the broker's directory lists the bucket again and refills it, in order;
    an entry of an emptied queue is kept until it was seen empty ``MIN_EMPTY_S`` apart."""
    for i in range(CAP + 2):
        rig.arrive(f"t{i}")
    rig.timer.run()
    assert len(rig.broker.directory) == 1, "the bucket was registered once"
    rig.parking.stop()  # this worker is gone ...
    rig.index.forget_all()  # ... and the store lost its index
    other = Parking(
        rig.parking.settings,
        rig.index,
        rig.timer,
        Counts(),
        hold=rig.hold,
        qos=lambda: rig.qos,
    )
    other.start(rig.broker)
    other.poll()
    assert [(p.queue, p.bucket) for p in rig.index.due(10)] == [("api", "api:a")]
    assert other.directory.found == 1
    other.directory._swept_s = 0.0
    other.poll()
    assert [m for _, m in rig.broker.delivered] == ["t5", "t6"]
    assert len(rig.broker.directory) == 1, "kept: its queue was just found with tasks"
