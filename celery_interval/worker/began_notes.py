"""Notes from pool processes to their worker that a body began: the worker may hear of it no
other way (a task released to the pool and not yet accepted when the channel closed: Celery
drops that process's reports of it)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
from collections.abc import Callable
from typing import Any

from celery_interval.stores.base import TaskCopy

__all__ = ["BeganNotes", "note_began", "open_pipe"]

logger = logging.getLogger("celery_interval.worker")

#: (read end, write end), made in the worker's main process before its pool forks.
_pipe: tuple[int, int] | None = None
_main_pid = 0


def open_pipe(**_: Any) -> None:
    """``worker_init``: make the pipe before the pool forks, so every pool process (one that
    replaces another too) has its write end; both ends never block."""
    global _pipe, _main_pid
    if _pipe is not None and _main_pid == os.getpid():
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    _pipe, _main_pid = (read_fd, write_fd), os.getpid()


def note_began(copy: TaskCopy) -> None:
    """In a pool process, once the body's done mark is posted (after its last claim): tell the
    worker. One write of at most ``PIPE_BUF`` bytes, so notes never interleave; a note that
    does not fit the pipe now is dropped (the store's mark stands for it)."""
    if _pipe is None or os.getpid() == _main_pid:
        return  # no pool process of a worker (threads, solo: the worker hears of it itself)
    line = json.dumps([copy.bucket, copy.task_id, copy.retries]).encode() + b"\n"
    if len(line) > select.PIPE_BUF:
        return
    with contextlib.suppress(OSError):  # full (BlockingIOError) or gone
        os.write(_pipe[1], line)


class BeganNotes:
    """The worker's read end: each note's copy goes to ``began``."""

    def __init__(self, began: Callable[[TaskCopy], None]) -> None:
        self._began = began
        self._partial = b""

    @property
    def fd(self) -> int | None:
        """The read end (None: no pipe, as outside ``celery worker``)."""
        return None if _pipe is None or _main_pid != os.getpid() else _pipe[0]

    def read(self) -> int:
        """Read what the pool processes noted since; returns how many copies."""
        fd = self.fd
        if fd is None:
            return 0
        chunks = [self._partial]
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        *lines, self._partial = b"".join(chunks).split(b"\n")
        for line in lines:
            try:
                bucket, task_id, retries = json.loads(line)
                copy = TaskCopy(str(bucket), str(task_id), int(retries))
            except (ValueError, TypeError):
                logger.warning("interval: a pool process's note is not one: %r", line[:200])
                continue
            self._began(copy)
        logger.debug("interval: %d body start(s) noted by pool processes", len(lines))
        return len(lines)
