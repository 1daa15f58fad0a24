"""kombu's sweep lock on a Redis broker: a sweeper that died holding it blocks the return of
every dead worker's messages for ``unacked_mutex_expire``; the worker makes that seconds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import kombu
import pytest
import redis
from celery import Celery

from celery_interval.demo.embedded import RedisProc
from celery_interval.worker.broker.visibility import UNACKED_MUTEX_EXPIRE_S, short_sweep_lock

#: A message is visible again (restorable) this long after its delivery.
VISIBILITY_S = 1.0


@pytest.fixture
def broker() -> Iterator[RedisProc]:
    proc = RedisProc()
    try:
        yield proc
    finally:
        proc.stop()


def test_a_redis_broker_gets_a_short_sweep_lock_unless_the_app_set_one() -> None:
    app = Celery(broker="redis://127.0.0.1:1/0")
    assert short_sweep_lock(app) == f"unacked_mutex_expire={UNACKED_MUTEX_EXPIRE_S}"
    assert app.conf.broker_transport_options["unacked_mutex_expire"] == UNACKED_MUTEX_EXPIRE_S
    own = Celery(broker="redis://127.0.0.1:1/0")
    own.conf.broker_transport_options = {"unacked_mutex_expire": 60, "visibility_timeout": 9}
    assert short_sweep_lock(own) == "unacked_mutex_expire=60 (set by the app)"
    assert own.conf.broker_transport_options == {
        "unacked_mutex_expire": 60,
        "visibility_timeout": 9,
    }
    assert short_sweep_lock(Celery(broker="amqp://guest@127.0.0.1//")) is None


def test_a_lock_left_by_a_dead_sweeper_holds_the_sweeps_back_for_seconds(broker: RedisProc) -> None:
    """A dead worker's unacked message; another sweeper took the lock and died: a live sweep
    puts nothing back while the lock lives, and the message once it has expired (kombu's
    default kept it 300 s)."""
    app = Celery(broker=broker.broker_url_for(1))
    app.conf.broker_transport_options = {"visibility_timeout": VISIBILITY_S}
    short_sweep_lock(app)
    queue = kombu.Queue("q", kombu.Exchange("q", "direct"), "q")
    with app.connection_for_write() as conn:
        conn.Producer().publish({"n": 1}, exchange=queue.exchange, routing_key="q", declare=[queue])
    dead = app.connection_for_read()
    taken = queue(dead.channel()).get(no_ack=False)
    assert taken is not None  # unacked, and its consumer never closes its channel: dead
    admin = redis.Redis.from_url(broker.url_for(1))
    with app.connection_for_read() as live:
        qos: Any = live.channel().qos
        lock = admin.lock("unacked_mutex", timeout=qos.unacked_mutex_expire)
        assert lock.acquire(blocking=False)  # and its holder dies: never released
        time.sleep(VISIBILITY_S + 0.2)
        qos.restore_visible(num=None, interval=1)
        assert admin.llen("q") == 0, "a sweep ran under another's lock"
        deadline = time.monotonic() + UNACKED_MUTEX_EXPIRE_S + 5
        while admin.llen("q") == 0:
            assert time.monotonic() < deadline, "the message never came back"
            time.sleep(0.5)
            qos.restore_visible(num=None, interval=1)
    assert admin.hlen("unacked") == 0
    admin.close()
