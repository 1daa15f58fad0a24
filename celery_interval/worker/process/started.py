"""What a pool process does before a released task's body: claim again if it came after its
start, post an ordinary task's done mark, and wait for the start."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from celery.exceptions import Ignore

from celery_interval.app_store import store_of
from celery_interval.config import settings_of
from celery_interval.errors import StoreError
from celery_interval.headers import (
    CLAIM_HEADER,
    CLOCK_HEADER,
    MARK_HEADER,
    SPIN_HEADER,
    START_HEADER,
    STORE_START_HEADER,
)
from celery_interval.placement import is_paced
from celery_interval.schedule import MAX_LEAD_US, Outcome
from celery_interval.stores import Store, TaskCopy
from celery_interval.stores.base import ClaimArgs
from celery_interval.worker.clock import local_ns

logger = logging.getLogger("celery_interval")

#: The pool process spins (rather than sleeps) the last stretch before a start, at most this
#: long and a fifth of the interval: a halted idle vCPU can wake a sleeper late, a running
#: process is on time. A longer spin is preempted on a busy host.
MAX_SPIN_NS = 500_000
#: A body that reaches its pool process more than this after its start (and a tenth of the
#: interval, but never less than MIN_MISS_NS: below that, lateness is the OS's scheduling
#: noise, and claiming again costs a whole interval) has missed it: it claims a new start
#: instead of running late and close to the next.
MAX_MISS_NS = 3_000_000
MIN_MISS_NS = 1_000_000

#: A link slower than MAX_LEAD_US each way cannot reach any start in time: after this many
#: admitted starts that were already past, the body runs at the last one.
MAX_CLAIMS = 3


def spin_ns_for(interval_us: int) -> int:
    """How long a pool process spins before a start of a bucket with this interval."""
    return min(MAX_SPIN_NS, interval_us * 200)


def lead_for(lead_us: int, handoff_us: int) -> int:
    """A claim's lead: at least its handoff (the start must stay reachable), at most
    MAX_LEAD_US."""
    return min(MAX_LEAD_US, max(lead_us, handoff_us))


def missed_after_ns(interval_us: int) -> int | None:
    """How late a pool process may reach a start before it counts as missed; None for an
    interval shorter than MIN_MISS_NS, where no start can be met closer than the OS allows."""
    if interval_us * 1000 < MIN_MISS_NS:
        return None
    return min(MAX_MISS_NS, max(MIN_MISS_NS, interval_us * 100))


def wait_until(deadline_ns: int, spin_ns: int, on_spin: Callable[[], None] | None = None) -> None:
    """Sleep until ``spin_ns`` before a monotonic deadline, then spin: waking from sleep can
    be milliseconds late on a VM whose idle vCPU was halted; a running process is on time.

    ``on_spin`` runs as the spin begins, so what it costs comes off the spin, not the start:
    a write to the store wakes redis-server, which may take this CPU for a while.
    """
    sleep_ns = deadline_ns - spin_ns - time.monotonic_ns()
    if sleep_ns > 0:
        time.sleep(sleep_ns / 1e9)
    if on_spin is not None:
        on_spin()
    while time.monotonic_ns() < deadline_ns:
        pass


def warm(app: Any) -> None:
    """Open this process's connection for posted marks in the background, as it starts (a
    store that is down then must not hold the process up)."""

    def connect() -> None:
        with contextlib.suppress(Exception):  # prepare() says so when a task needs it
            store_of(app).prepare_post()

    threading.Thread(target=connect, name="interval-warm", daemon=True).start()


def before_body(app: Any, request: Any) -> None:
    """Wait for the start the worker claimed; claim a new one if this process came too late
    (a pool process replaced, a full pool), which the request then names on the store's clock
    (``STORE_START_HEADER``); post the done mark as the wait ends.

    Raises ``Ignore`` when the new claim finds the task running or done under another copy.
    """
    start_ns = int(request.get(START_HEADER))
    claimed = request.get(CLAIM_HEADER)
    post = None
    if isinstance(claimed, ClaimArgs):
        late_ns = time.monotonic_ns() - start_ns
        missed_ns = missed_after_ns(settings_of(app).pace_us(claimed.bucket, claimed.interval_us))
        if missed_ns is not None and late_ns > missed_ns:
            offset_ns = request.get(CLOCK_HEADER)
            offset_ns = offset_ns if isinstance(offset_ns, int) else None
            start_ns, start_us = _claim_again(app, claimed, late_ns, missed_ns, offset_ns)
            request.update({STORE_START_HEADER: start_us})
        if request.get(MARK_HEADER):
            post = poster(app, claimed.copy)
    wait_until(start_ns, int(request.get(SPIN_HEADER) or 0), post)


def _claim_again(
    app: Any, claimed: ClaimArgs, late_ns: int, missed_ns: int, offset_ns: int | None = None
) -> tuple[int, int]:
    """A new start (monotonic ns, and store µs) under the same holder: the store admits one
    an interval after the last start, as for a holder that never heard of its admitted start.

    The store decided somewhere inside the round trip: the start is mapped with the worker's
    clock estimate ``offset_ns`` (``CLOCK_HEADER``) clamped into the trip, or as if it decided
    at the reply without one (never before the admitted start, at most one trip after). A
    start already further in the past than a miss, the decision taken as halfway through the
    trip (a slow link), is claimed again with the reply's way back added to the handoff, so
    the body neither runs late nor close to the next start.
    """
    bucket, task_id = claimed.bucket, claimed.task_id
    settings = settings_of(app)
    store = store_of(app)
    logger.warning(
        "interval %s: task %s reached the pool %.1f ms after its start, claiming a new start",
        bucket,
        task_id,
        late_ns / 1e6,
    )
    backoff_s, attempts = 0.05, 0
    while True:
        lead_us = lead_for(settings.lead_us, claimed.handoff_us)
        sent_ns = time.monotonic_ns()
        try:
            result = claimed.claim(store, settings.lease_us, lead_us)
        except StoreError as exc:  # an outage or an error reply: the task waits, never lost
            logger.warning("interval %s: no new claim from the store (%s)", bucket, exc)
            time.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, settings.retry_max_s)
            continue
        received_ns = time.monotonic_ns()
        if result.outcome is Outcome.OK:
            halfway_ns = (sent_ns + received_ns) // 2 + result.delay_us * 1000
            attempts += 1
            if received_ns - halfway_ns <= missed_ns or attempts >= MAX_CLAIMS:
                start_us = result.now_us + result.delay_us
                return local_ns(
                    start_us, sent_ns, received_ns, result.delay_us, offset_ns
                ), start_us
            claimed = claimed._replace(
                handoff_us=settings.handoff_us + (received_ns - sent_ns) // 2000
            )
            continue
        if result.outcome is Outcome.WAIT:
            time.sleep(max(0, result.delay_us - settings.lead_us) / 1e6)
        elif result.outcome is Outcome.FULL:  # the cap's places are all others': one frees
            time.sleep(result.delay_us / 1e6)
        elif result.outcome is Outcome.PAUSED:
            time.sleep(settings.pause_poll_s)
        elif result.outcome is Outcome.RETICKET:
            again = _reticketed(store, claimed)
            if again is None:
                time.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, settings.retry_max_s)
                continue
            claimed, delay_us = again
            time.sleep(max(0, delay_us - settings.lead_us) / 1e6)
        else:
            _not_this_copy(bucket, task_id, result.outcome)


def _reticketed(store: Any, claimed: ClaimArgs) -> tuple[ClaimArgs, int] | None:
    """``claimed`` with a new ticket, and its slot's delay (µs); None while the store fails."""
    try:
        grant = store.grant(claimed.copy, claimed.pace())
    except StoreError as exc:
        logger.warning("interval %s: no new ticket from the store (%s)", claimed.bucket, exc)
        return None
    again = claimed._replace(epoch=grant.epoch, slot_us=grant.slot_us, ticket=grant.ticket)
    return again, grant.delay_us


def _not_this_copy(bucket: str, task_id: str, outcome: Outcome) -> NoReturn:
    """The task is done (DUPLICATE) or running (HELD) under another copy: this one ends."""
    logger.warning(
        "interval %s: task %s is %s under another copy, this one does not run",
        bucket,
        task_id,
        "done" if outcome is Outcome.DUPLICATE else "running",
    )
    raise Ignore()


def poster(app: Any, mark: TaskCopy) -> Callable[[], None] | None:
    """Before a start's wait: make the connection for the task's done mark ready, and return
    what posts the mark (None without a store). A store out of reach now gets the mark as
    the body ends (``after_body``) or with this process's next task, once it answers."""
    try:
        store = store_of(app)
        dedupe_ttl_us = settings_of(app).dedupe_ttl_us
    except Exception as exc:
        logger.warning(
            "interval %s: task %s will start without posting its done mark: %s",
            mark.bucket,
            mark.task_id,
            exc,
        )
        return None
    try:
        store.prepare_post()
    except Exception as exc:
        logger.warning(
            "interval %s: task %s starts before its done mark can reach the store (%s): "
            "it goes once the store answers",
            mark.bucket,
            mark.task_id,
            exc,
        )
    return functools.partial(_post, store, mark, dedupe_ttl_us)


def _post(store: Store, mark: TaskCopy, dedupe_ttl_us: int) -> None:
    """Post an ordinary task's done mark as the last spin before its start begins (at most
    ``MAX_SPIN_NS``, 0.5 ms, before the body); the worker leaves it to us.

    Celery acks an ordinary task as its start comes due, in the worker process, while the pool
    process starts the body: a worker killed in between left a message the broker gave back,
    whose copy ran again once the lease ended. With the mark posted first, that copy is a
    duplicate; and a task whose worker died before that spin began has no mark, so its copy
    runs. Posting never waits for the store, and goes out during the spin because the write
    wakes redis-server, which may take this CPU for a while. If it fails, the body starts
    anyway (its claim was granted) and the mark is owed: it goes as the body ends if the store
    answers within ``SETTLE_S`` (``after_body``), else with this process's next task; a copy
    of a task whose worker died before (a copy exists only if the ack was lost too) runs again.
    """
    try:
        store.post_done(mark, dedupe_ttl_us)
    except Exception as exc:
        logger.warning(
            "interval %s: task %s starts before its done mark was sent: %s",
            mark.bucket,
            mark.task_id,
            exc,
        )


#: After a body, how long its pool process waits at most for its posted done mark's reply.
SETTLE_S = 1.0


def after_body(task: Any = None, **_: Any) -> None:
    """``task_postrun``: the body of a task whose pool process posted its done mark ended;
    before the process reports the end, see that the mark reached the store (a connection cut
    after the post took it along, or the store was out of reach as the body began; a worker
    killed before the process's next task would leave a copy free to run again)."""
    request = getattr(task, "request", None)
    if request is None or not request.get(MARK_HEADER) or request.get(START_HEADER) is None:
        return
    try:
        store_of(task.app).settle_post(SETTLE_S)
    except Exception as exc:
        logger.warning(
            "interval: task %s ended; its done mark may not have reached the store (%s): "
            "it goes with this process's next task",
            request.id,
            exc,
        )


def before_plain_body(task: Any = None, **_: Any) -> None:
    """``task_prerun``: a plain task released from an interval queue waits for its start too
    (an IntervalTask does so in ``__call__``, closer to its body)."""
    if task is None or is_paced(task):
        return
    request = task.request
    if request.get(START_HEADER) is not None:
        before_body(task.app, request)
