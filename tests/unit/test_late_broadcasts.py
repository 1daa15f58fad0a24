"""A pause, unpause or interval broadcast that reaches a worker late never undoes a newer
command: the library's broadcast carries ``applied`` and the workers' handlers do not write it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from celery import Celery
from celery.utils.collections import AttributeDict

from celery_interval import control
from celery_interval.worker import control as handlers

#: The broadcasts an app sent, as (command, arguments).
Sent = list[tuple[str, dict[str, Any]]]


class Recorder:
    """A worker's side of the broadcasts: the held buckets it woke, the events it sent."""

    def __init__(self) -> None:
        self.paused = {"api"}
        self.woken: list[str] = []
        self.events: list[tuple[str, str]] = []
        self.notify = SimpleNamespace(
            control=lambda action, q, _st: self.events.append((action, q))
        )

    def wake(self, bucket: str) -> None:
        self.woken.append(bucket)


def _app() -> tuple[Celery, Sent]:
    """An app on a memory store whose broadcasts are recorded, not sent."""
    app = Celery("late", set_as_current=False)
    app.conf.interval_store_url = "memory://"
    app.conf.interval_queues = {"api": 1.0}
    sent: Sent = []
    app.control.broadcast = lambda command, arguments=None, **_: sent.append((command, arguments))  # type: ignore[method-assign]
    return app, sent


def _deliver(app: Celery, recorder: Recorder, broadcast: tuple[str, dict[str, Any]]) -> Any:
    """Run ``broadcast`` through the worker's handler, as kombu's pidbox does."""
    command, arguments = broadcast
    state = AttributeDict(app=app, consumer=SimpleNamespace(interval_service=recorder))
    return getattr(handlers, command)(state, **arguments)


def test_an_old_pause_delivered_after_the_unpause_leaves_the_bucket_running() -> None:
    app, sent = _app()
    control.pause(app, "api")
    control.unpause(app, "api")
    late = Recorder()
    reply = _deliver(app, late, sent[0])
    assert sent[0][0] == "pause_queue"
    assert control.status(app, "api").paused is False
    assert reply["ok"]["paused"] is False and reply["stale"] is True
    assert late.events == []
    reply = _deliver(app, late, sent[1])
    assert "stale" not in reply and late.woken == ["api"]
    assert late.events == [("unpaused", "api")]


def test_an_old_unpause_delivered_after_a_new_pause_wakes_nothing() -> None:
    app, sent = _app()
    control.pause(app, "api")
    control.unpause(app, "api")
    control.pause(app, "api")
    late = Recorder()
    for broadcast in sent:
        _deliver(app, late, broadcast)
    assert control.status(app, "api").paused is True
    assert late.woken == []
    # Both pauses agree with the store; the unpause between them does not.
    assert late.events == [("paused", "api"), ("paused", "api")]


def test_an_old_interval_delivered_after_a_newer_one_is_not_applied() -> None:
    app, sent = _app()
    control.set_interval(app, "api", 2.0)
    control.set_interval(app, "api", "4/s")
    old = _deliver(app, Recorder(), sent[0])
    assert old["stale"] is True
    assert control.status(app, "api").interval_us == 250_000
    control.unset_interval(app, "api")
    assert "stale" in _deliver(app, Recorder(), sent[1])
    assert control.status(app, "api").overridden is False
    assert "stale" not in _deliver(app, Recorder(), sent[2])


def test_a_broadcast_without_applied_writes_the_store_itself() -> None:
    # `celery control pause_queue api` sends only the broadcast: the handler writes it.
    app, _ = _app()
    recorder = Recorder()
    assert _deliver(app, recorder, ("pause_queue", {"queue": "api"}))["ok"]["paused"] is True
    assert control.status(app, "api").paused is True
    _deliver(app, recorder, ("set_interval", {"queue": "api", "interval": "2"}))
    assert control.status(app, "api").interval_us == 2_000_000
    _deliver(app, recorder, ("unpause_queue", {"queue": "api"}))
    assert control.status(app, "api").paused is False and recorder.woken == ["api"]


def test_an_applied_broadcast_for_an_unknown_queue_is_an_error_reply() -> None:
    app, _ = _app()
    reply = _deliver(app, Recorder(), ("pause_queue", {"queue": "nope", "applied": True}))
    assert "unknown interval bucket" in reply["error"]
    reply = _deliver(
        app, Recorder(), ("set_interval", {"queue": "api", "interval": "x", "applied": True})
    )
    assert "interval" in reply["error"]
