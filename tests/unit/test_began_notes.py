"""A pool process tells its worker that a body began, through a pipe made before the fork."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_interval.config import settings_of
from celery_interval.stores.base import TaskCopy
from celery_interval.worker import began_notes
from celery_interval.worker.began_notes import BeganNotes, note_began, open_pipe
from celery_interval.worker.bootstep import _began
from celery_interval.worker.done import DoneMarks
from tests.helpers.fakes import Timer


@pytest.fixture
def pipe(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(began_notes, "_pipe", None)
    open_pipe()
    yield
    assert began_notes._pipe is not None
    for fd in began_notes._pipe:
        os.close(fd)


def _pool_process(copies: list[TaskCopy]) -> None:
    for copy in copies:
        note_began(copy)


def test_notes_from_forked_processes_reach_the_worker(pipe: None) -> None:
    copies = [TaskCopy("api:acme", f"t{i}", i % 3) for i in range(200)]
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_pool_process, args=(copies[i::2],)) for i in (0, 1)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    got: list[TaskCopy] = []
    notes = BeganNotes(got.append)
    assert notes.read() == 200
    assert sorted(got, key=repr) == sorted(copies, key=repr)
    assert notes.read() == 0


def test_the_worker_s_own_process_writes_no_note(pipe: None) -> None:
    """Threads and solo pools run bodies in the worker's process, which hears of them itself."""
    note_began(TaskCopy("api", "t1", 0))
    got: list[TaskCopy] = []
    assert BeganNotes(got.append).read() == 0 and got == []


def test_a_line_cut_between_reads_and_a_bad_line(pipe: None) -> None:
    assert began_notes._pipe is not None
    write_fd = began_notes._pipe[1]
    got: list[TaskCopy] = []
    notes = BeganNotes(got.append)
    os.write(write_fd, b'["api", "t1", 0]\n["api", "t')
    assert notes.read() == 1
    os.write(write_fd, b'2", 1]\nnot json\n')
    assert notes.read() == 2
    assert got == [TaskCopy("api", "t1", 0), TaskCopy("api", "t2", 1)]


def test_a_noted_copy_is_remembered_as_begun_and_its_mark_is_written_at_a_new_birth() -> None:
    app = Celery("notes", set_as_current=False)
    app.conf.update(interval_store_url="memory://", interval_queues={"api": 0.1})
    done = DoneMarks(settings_of(app), store=None, timer=Timer(), outage=None)  # type: ignore[arg-type]

    class Consumer:
        interval_service: Any = type("Service", (), {"done": done})()

    copy = TaskCopy("api", "orphan", 0)
    _began(Consumer(), copy)
    assert done.began_here(copy)
    assert done.write_again() == 1 and done.pending == [copy]
