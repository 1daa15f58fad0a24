"""A worker remembers the copies whose bodies began there, within the dedupe window and a cap."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery import Celery

from celery_interval.config import settings_of
from celery_interval.stores.base import TaskCopy
from celery_interval.worker.store import done
from celery_interval.worker.store.births import Births
from celery_interval.worker.store.done import DoneMarks
from tests.helpers.fakes import Timer


def marks(**conf: Any) -> DoneMarks:
    app = Celery("began", set_as_current=False)
    app.conf.update(interval_store_url="memory://", interval_queues={"q": 0.1}, **conf)
    return DoneMarks(settings_of(app), store=None, timer=Timer(), outage=None)  # type: ignore[arg-type]


def test_a_copy_that_began_here_is_known_and_another_generation_is_not() -> None:
    m = marks()
    m.began(TaskCopy("q", "t1", 0))
    assert m.began_here(TaskCopy("q", "t1", 0))
    assert not m.began_here(TaskCopy("q", "t1", 1))  # its retry is a new message
    assert not m.began_here(TaskCopy("q", "t2", 0))


def test_the_oldest_copies_are_forgotten_beyond_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(done, "BEGAN_KEPT", 3)
    m = marks()
    for i in range(5):
        m.began(TaskCopy("q", f"t{i}", 0))
    assert [m.began_here(TaskCopy("q", f"t{i}", 0)) for i in range(5)] == [
        False,
        False,
        True,
        True,
        True,
    ]


def test_a_copy_is_forgotten_after_the_dedupe_window(monkeypatch: pytest.MonkeyPatch) -> None:
    now_s = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now_s[0])
    m = marks(interval_dedupe_ttl_s=60)
    m.began(TaskCopy("q", "old", 0))
    now_s[0] += 59.0
    assert m.began_here(TaskCopy("q", "old", 0))
    now_s[0] += 2.0
    m.began(TaskCopy("q", "new", 0))  # forgets what expired
    assert not m.began_here(TaskCopy("q", "old", 0))
    assert m.began_here(TaskCopy("q", "new", 0))
    assert len(m._began) == 1


def test_a_new_birth_writes_again_the_marks_of_bodies_that_ended_here() -> None:
    """A store born again gets the done marks of the bodies that ended here, not of one still
    running or throttled (its copy sent again must run), once per birth."""
    m = marks()
    ran, running, throttled = (TaskCopy("q", t, 0) for t in ("ran", "running", "throttled"))
    m.began(ran)
    m.ended(ran)
    m.began(running)
    m.began(throttled)  # its body ended in Throttled: ``ended`` is not called
    births = Births(m)
    births.saw(1_000)  # the first birth seen: nothing to write
    assert m.pending == []
    births.saw(1_000)
    assert m.pending == []
    backoff = m.timer.call_after(8.0, m.flush)  # an outage's backoff flush, pending
    m._entry = backoff
    births.saw(2_000)
    assert m.pending == [ran]
    assert [delay_s for delay_s, *_ in m.timer.entries] == [0.0]  # sent at once
    assert births.latest_us == 2_000  # the next claims carry it


def test_a_body_running_as_the_store_was_born_again_gets_its_mark_as_it_ends() -> None:
    """Its mark is owed, not written at the birth (a late pool process that claims again must
    not meet it), and goes out as the body ends: a copy back on another worker then finds it.
    A body throttled meanwhile, or forgotten, owes none."""
    m = marks()
    running, throttled = TaskCopy("q", "running", 0), TaskCopy("q", "throttled", 0)
    m.began(running)
    m.began(throttled)
    births = Births(m)
    births.saw(1_000)
    births.saw(2_000)
    assert m.pending == []
    m.ended(running)
    assert m.pending == [running]
    m.ended(running)  # once
    assert m.pending == [running]
    assert m._owed == {throttled}  # its body ended in Throttled: no ``ended``, no mark


def test_a_body_admitted_before_the_birth_and_acked_after_the_rewrite_gets_its_mark() -> None:
    """Its mark was posted to the store that lost it, and its ack came after the rewrite: the
    mark goes again (now if the body ended, as it ends if not); a body admitted after the
    birth posted its mark to the new store and owes none."""
    m = marks()
    births = Births(m)
    births.saw(1_000)
    births.saw(2_000)
    ended, running, after = (TaskCopy("q", t, 0) for t in ("ended", "running", "after"))
    m.began(ended, ended=True, start_us=1_500)
    m.began(running, start_us=1_900)
    m.began(after, start_us=2_100)
    assert m.pending == [ended]
    assert m._owed == {running}
    m.ended(running)
    m.ended(after)
    assert m.pending == [ended, running]


def test_no_mark_goes_again_before_any_birth_was_seen_again() -> None:
    m = marks()
    Births(m).saw(1_000)  # the first birth seen: no state was lost
    m.began(TaskCopy("q", "t", 0), ended=True, start_us=500)
    assert m.pending == [] and m._owed == set()
