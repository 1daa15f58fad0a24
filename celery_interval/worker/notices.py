"""Bodies beginning, told by the pool processes to their worker on a pipe the store cannot lose.

A task released to the pool as the broker channel closed is one Celery forgets: a process may
still run it, and its end is never reported. The worker learns that its body began from the
done mark the process posts, read from the store; a store that loses its state between the
post and a read takes that knowledge with it, and a copy the broker hands back runs again.
A notice written to this pipe before the mark is posted reaches the worker whatever the store
does: a thread of the worker reads it, so it arrives while the event loop waits for the
broker too. A prefork worker makes the pipe before its pool forks (the processes inherit
its write end); other pools run without it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from typing import Any, Protocol

from celery_interval.stores.base import TaskCopy

__all__ = ["BEGUN", "THROTTLED", "begin_notices", "listen", "tell"]

logger = logging.getLogger("celery_interval.worker")

#: A notice's kinds: the body of a copy is about to begin (its done mark posted next), or its
#: run was throttled and its copy sent again (it must run again).
BEGUN, THROTTLED = "B", "T"
#: At most this many bytes per notice: a write this small to a pipe is atomic.
MAX_NOTICE_BYTES = 512


class Listener(Protocol):
    def notice(self, kind: str, copy: TaskCopy, read_s: float) -> None: ...


class BeginNotices:
    """This process's pipe: the pool processes write to it (``tell``); a daemon thread reads
    each notice and hands it, with when it was read (monotonic seconds), to every listener."""

    def __init__(self) -> None:
        self._read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)  # a full pipe loses the notice, never stalls a body
        self._listeners: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, name="interval-notices", daemon=True)
        self._thread.start()

    def listen(self, listener: Listener) -> None:
        """Hand each notice read from now on to ``listener`` too (held weakly)."""
        with self._lock:
            self._listeners.add(listener)

    def _read(self) -> None:
        rest = b""
        while True:
            try:
                chunk = os.read(self._read_fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            *lines, rest = (rest + chunk).split(b"\n")
            read_s = time.monotonic()
            with self._lock:
                listeners = list(self._listeners)
            for line in lines:
                parsed = _parse(line)
                if parsed is not None:
                    for listener in listeners:
                        listener.notice(*parsed, read_s)


_notices: BeginNotices | None = None


def begin_notices() -> BeginNotices:
    """This process's pipe, made on first use: by the worker, before its pool forks."""
    global _notices
    if _notices is None:
        _notices = BeginNotices()
    return _notices


def listen(listener: Listener) -> None:
    """Hand ``listener`` the notices of this process's pipe, if one was made."""
    if _notices is not None:
        _notices.listen(listener)


def tell(kind: str, copy: TaskCopy) -> None:
    """In a pool process: tell the worker what happens to ``copy`` (nothing if no pipe was made
    before this process forked, or the notice would not fit in one atomic write)."""
    if _notices is None:
        return
    line = f"{kind}\t{copy.bucket}\t{copy.task_id}\t{copy.retries}\n".encode()
    if len(line) > MAX_NOTICE_BYTES:
        return
    with contextlib.suppress(OSError):
        os.write(_notices.write_fd, line)


def _parse(line: bytes) -> tuple[str, TaskCopy] | None:
    parts = line.decode(errors="replace").split("\t")
    if len(parts) != 4 or parts[0] not in (BEGUN, THROTTLED) or not parts[3].isdigit():
        logger.warning("interval: a notice from a pool process was not understood: %r", line)
        return None
    return parts[0], TaskCopy(parts[1], parts[2], int(parts[3]))
