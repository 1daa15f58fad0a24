"""The events a test pool's workers send, captured by a real event receiver."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from tests.helpers.pool import Pool


@contextlib.contextmanager
def receiving(pool: Pool) -> Iterator[list[dict[str, Any]]]:
    """Every event the workers send, captured by a real ``Receiver`` on a thread."""
    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    receiver: Any = None

    def capture() -> None:
        nonlocal receiver
        with pool.app.connection_for_read() as conn:
            receiver = pool.app.events.Receiver(conn, handlers={"*": seen.append})
            with receiver.consumer_context(wakeup=False) as (live, _, _):
                ready.set()  # the receiver's queue is bound from here on
                while not receiver.should_stop:
                    with contextlib.suppress(TimeoutError):
                        live.drain_events(timeout=0.2)

    thread = threading.Thread(target=capture, daemon=True)
    thread.start()
    assert ready.wait(10), "the event receiver did not start"
    # A Redis broker subscribes the receiver on its first read: until a probe comes through,
    # an event sent may be missed.
    deadline = time.monotonic() + 20
    while not any(e["type"] == "test-probe" for e in list(seen)):
        assert time.monotonic() < deadline, "the event receiver never saw its probe"
        with pool.app.events.default_dispatcher() as dispatcher:
            dispatcher.send("test-probe")
        time.sleep(0.1)
    try:
        yield seen
    finally:
        if receiver is not None:
            receiver.should_stop = True
        thread.join(10)
