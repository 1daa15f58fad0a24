"""The unacked-score refresh of a Redis broker channel, against a real Redis: held messages'
scores move to now, acknowledged ones are never written back, other transports are left alone."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from celery_interval.worker.broker.visibility import VisibilityRefresh, refresh_every_s
from tests.helpers.fakes import Timer


def test_a_third_of_the_timeout_within_bounds() -> None:
    assert refresh_every_s(3600.0) == 300.0
    assert refresh_every_s(6.0) == 2.0
    assert refresh_every_s(0.9) == 0.5


def test_held_scores_move_to_now_and_acked_ones_stay_gone(redis_server: Any) -> None:
    from kombu import Connection

    with Connection(redis_server.broker_url_for(2)) as conn:
        channel: Any = conn.default_channel
        client = redis.Redis.from_url(redis_server.url_for(2))
        old_s = time.time() - 100
        client.zadd(channel.unacked_index_key, {"held-1": old_s, "held-2": old_s, "other": old_s})
        channel.qos._delivered.update({"held-1": object(), "held-2": object(), "acked": object()})
        timer = Timer()
        refresh = VisibilityRefresh(timer)
        refresh.start(channel)
        assert [every_s for every_s, *_ in timer.repeating] == [300.0]  # kombu's 3600 s / 3, capped
        before_s = time.time()
        assert refresh.refresh() == 3
        scores = dict(client.zrange(channel.unacked_index_key, 0, -1, withscores=True))
        assert scores[b"held-1"] >= before_s and scores[b"held-2"] >= before_s
        assert scores[b"other"] == pytest.approx(old_s)  # another worker's message
        assert b"acked" not in scores  # XX: never written back
        refresh.stop()
        assert not timer.repeating
        channel.qos._delivered.clear()


def test_nothing_on_another_transport() -> None:
    from kombu import Connection

    with Connection("memory://") as conn:
        timer = Timer()
        VisibilityRefresh(timer).start(conn.default_channel)
        assert not timer.repeating
