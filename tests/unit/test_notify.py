"""What a worker tells onlookers: signals of grants, claims and control actions; event groups;
the banner."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from celery import Celery

from celery_interval import control, signals
from celery_interval.stores.memory import MemoryStore
from celery_interval.worker.banner import banner_text
from celery_interval.worker.notify import Notify
from tests.helpers.fakeclock import Clock
from tests.helpers.fakes import INTERVAL_US, fire_due, held_copy, make_service


@contextlib.contextmanager
def catching(*watched: Any) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every send of the ``watched`` signals, as (signal name, keyword arguments)."""
    seen: list[tuple[str, dict[str, Any]]] = []
    receivers = []
    for signal in watched:

        def receiver(sender: Any = None, _name: str = signal.name, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            seen.append((_name, {"sender": sender, **kwargs}))

        signal.connect(receiver, weak=False)
        receivers.append((signal, receiver))
    try:
        yield seen
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)


def test_grants_and_claims_send_signals_with_the_slot() -> None:
    clock = Clock(10**15)
    store = MemoryStore(clock_us=clock)
    started: list[str] = []
    service = make_service(store, started)
    with catching(signals.slot_granted, signals.slot_claimed) as seen:
        for task_id in ("t1", "t2"):
            service.receive(held_copy(service, task_id, started))
        fire_due(service.timer, clock, within_s=1.0)
    assert started == ["t1", "t2"]
    granted = [kw for name, kw in seen if name == "interval_slot_granted"]
    claimed = [kw for name, kw in seen if name == "interval_slot_claimed"]
    assert [(g["bucket"], g["ticket"]) for g in granted] == [("api", 1), ("api", 2)]
    assert granted[1]["eta"] > granted[0]["eta"]
    assert granted[1]["delay_s"] >= INTERVAL_US / 1e6 - 0.001
    assert [(c["request"].id, c["outcome"]) for c in claimed if c["outcome"] == "OK"] == [
        ("t1", "OK"),
        ("t2", "OK"),
    ]
    assert all(c["late_s"] >= 0 for c in claimed if c["outcome"] == "OK")


def test_control_actions_send_signals_in_the_process_that_ran_them() -> None:
    app = Celery("signals", set_as_current=False)
    app.conf.interval_store_url = "memory://"
    app.conf.interval_queues = {"api": 1.0}
    with catching(
        signals.queue_paused, signals.queue_unpaused, signals.interval_changed, signals.bucket_reset
    ) as seen:
        control.pause(app, "api", broadcast=False)
        control.set_interval(app, "api:acme", "10/s", broadcast=False)
        control.unpause(app, "api", broadcast=False)
        control.reset(app, "api")
    assert [(name, kw["bucket"]) for name, kw in seen] == [
        ("interval_queue_paused", "api"),
        ("interval_changed", "api:acme"),
        ("interval_queue_unpaused", "api"),
        ("interval_bucket_reset", "api"),
    ]
    assert seen[0][1]["status"].paused is True
    assert seen[1][1]["interval_s"] == 0.1 and seen[1][1]["action"] == "set"


def _events_sent(groups: list[str] | None, enabled: bool = True) -> list[dict[str, Any]]:
    """The events one ``Notify.control`` call reaches a real receiver with (memory broker)."""
    app = Celery("events", broker="memory://", set_as_current=False)
    seen: list[dict[str, Any]] = []
    with app.connection_for_write() as conn:
        receiver = app.events.Receiver(conn, handlers={"*": seen.append})
        with receiver.consumer_context(wakeup=False) as (live, _, _):
            dispatcher = app.events.Dispatcher(
                app.connection_for_write(), enabled=enabled, groups=groups
            )
            Notify(lambda: dispatcher).control("paused", "api:acme", {"paused": True})
            dispatcher.flush()
            with contextlib.suppress(TimeoutError):
                for _ in range(3):
                    live.drain_events(timeout=0.2)
            dispatcher.close()
    return seen


def test_interval_events_go_wherever_task_events_go() -> None:
    (event,) = _events_sent(None)  # -E: every group
    assert (event["type"], event["bucket"], event["queue"]) == (
        "interval-paused",
        "api:acme",
        "api",
    )
    assert len(_events_sent(["worker", "task"])) == 1  # enable_events on a worker without -E
    assert _events_sent(["worker"]) == []  # task events off
    assert _events_sent(None, enabled=False) == []


def test_the_banner_names_queues_intervals_and_a_masked_store() -> None:
    app = Celery("banner", set_as_current=False)
    app.conf.interval_store_url = "redis://:s3cret@10.0.0.5:6379/2"
    app.conf.interval_queues = {"api": 0.5, "mail": "2/m"}
    text = banner_text(app)
    assert "[interval queues]" in text
    assert ". api: 0.5s (one start every 0.5 s = 2/s); not consumed here" in text
    assert "s3cret" not in text and "10.0.0.5:6379/2" in text
    assert ". mail: 30s (one start every 30 s = 0.03333/s); not consumed here" in text
    app.amqp.queues.select(["api", "mail"])  # a worker run with -Q api,mail
    assert "not consumed" not in banner_text(app)
