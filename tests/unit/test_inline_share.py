"""A bucket's ``interactive_share``: validated naming key and value; ``slot()`` ahead of a task
backlog on a real Redis, within its share; the tickets it passes wait, in order."""

from __future__ import annotations

import math
import re
import time
from typing import Any

import pytest
import redis
from celery import Celery

from celery_interval import ConfigurationError, SlotTimeout, slot
from celery_interval.app_store import store_of
from celery_interval.config import settings_of
from celery_interval.config.table import KEY_PREFIX
from celery_interval.demo.embedded import RedisProc
from celery_interval.schedule import ClaimTerms, Outcome, Pace
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.keys import ledger_key
from tests.helpers.apps import make_app, memory_app
from tests.helpers.ledgers import starts_us

INTERVAL_S = 0.1
INTERVAL_US = round(INTERVAL_S * 1e6)


def test_a_share_per_bucket_and_tenants_take_their_queues() -> None:
    declared = {"api": {"interval": 0.05, "interactive_share": 0.2}}
    share_of = settings_of(
        memory_app(**declared, **{"api:vip": {"interactive_share": 0.5}})
    ).share_of
    found = {bucket: share_of(bucket) for bucket in ("api", "api:acme", "api:vip", "mail")}
    assert found == {"api": 0.2, "api:acme": 0.2, "api:vip": 0.5, "mail": None}
    assert settings_of(memory_app()).share_of("api") is None


@pytest.mark.parametrize(
    ("value", "shown"),
    [(0, "0"), (1, "1"), (1.5, "1.5"), (-0.1, "-0.1"), ("0.2", "'0.2'"), (True, "True"),
     (math.nan, "nan")],
)  # fmt: skip
def test_a_bad_share_is_refused_naming_the_key_and_value(value: Any, shown: str) -> None:
    app = memory_app(api={"interval": 0.05, "interactive_share": value})
    with pytest.raises(ConfigurationError) as info:
        settings_of(app)
    assert f"interval_queues['api']['interactive_share']={shown}" in str(info.value)
    assert "above 0 and below 1" in str(info.value)


def _backlog(app: Celery, n: int) -> None:
    store = store_of(app)
    for i in range(n):  # a backlog of tasks n intervals deep
        store.grant(TaskCopy("api", f"t{i}", 0), Pace(INTERVAL_US))


def test_slot_goes_ahead_of_a_backlog_within_its_share(
    redis_server: RedisProc, redis_client: redis.Redis[Any]
) -> None:
    """A backlog 3 s deep: without a share a slot() would wait behind it (it times out at once);
    with a share of 0.25 the first starts within an interval or so, the next one a share
    interval (4 intervals) after it, and every start is an interval apart."""
    plain = make_app(redis_server)
    _backlog(plain, 30)
    with (
        pytest.raises(SlotTimeout, match=r"the next start is (\d+\.\d+)s away") as behind,
        slot(plain, "api", timeout_s=1.0),
    ):
        pytest.fail("the block ran")
    away = re.search(r"the next start is (\d+\.\d+)s away", str(behind.value))
    assert away is not None and float(away.group(1)) > 2.0, "behind the backlog (less its age)"
    app = make_app(redis_server, interactive_share=0.25)
    before = store_of(app).status("api", INTERVAL_US)
    with slot(app, "api", timeout_s=1.0) as first:
        pass
    with slot(app, "api", timeout_s=1.0) as second:
        pass
    assert (first.ticket, second.ticket) == (31, 32)  # after the backlog's 30
    starts = starts_us(redis_client)
    assert len(starts) == 2 and starts[1] - starts[0] >= 4 * INTERVAL_US - 20_000
    entries = redis_client.xrange(ledger_key(KEY_PREFIX, "api"))
    grants = [f for _id, f in entries if f.get(b"front") == b"1"]  # on the store's clock
    assert int(grants[0][b"delay"]) <= 2 * INTERVAL_US, grants[0]
    fronts = [int(f[b"slot"]) for f in grants]
    assert len(fronts) == 2 and fronts[1] - fronts[0] >= 4 * INTERVAL_US, "the share's slots"
    assert int(grants[1][b"delay"]) <= 5 * INTERVAL_US, grants[1]
    status = store_of(app).status("api", INTERVAL_US)
    assert status.ticket == 32
    next_slot_us = status.virtual_now_us + status.next_slot_in_us  # the store's clock
    assert next_slot_us >= before.virtual_now_us + before.next_slot_in_us + 2 * INTERVAL_US, (
        "the next ticket comes after the backlog and both inline starts"
    )
    with (
        pytest.raises(SlotTimeout, match=r"past slot\(timeout_s=0\.05\)"),
        slot(app, "api", timeout_s=0.05),
    ):
        pytest.fail("the share's wait is longer than the timeout")


def test_a_passed_ticket_waits_and_keeps_its_turn(
    redis_server: RedisProc, redis_client: redis.Redis[Any]
) -> None:
    """The ticket due when an inline start went ahead claims WAIT, an interval later; the one
    after it too: no RETICKET, order kept."""
    app = make_app(redis_server, interactive_share=0.5)
    store = store_of(app)
    first = store.grant(TaskCopy("api", "t0", 0), Pace(INTERVAL_US))
    time.sleep(first.delay_us / 1e6)
    grants = [store.grant(TaskCopy("api", f"t{i}", 0), Pace(INTERVAL_US)) for i in (1, 2)]
    terms = ClaimTerms("w1", 10**7, lead_us=20_000)
    claimed = store.claim(TaskCopy("api", "t0", 0), INTERVAL_US, first.slot, terms)
    assert claimed.outcome is Outcome.OK
    with slot(app, "api") as started:
        assert started.waited_s <= 2 * INTERVAL_S
    for i, g in zip((1, 2), grants, strict=True):
        claimed = store.claim(TaskCopy("api", f"t{i}", 0), INTERVAL_US, g.slot, terms)
        assert claimed.outcome is Outcome.WAIT, (i, claimed)
        assert claimed.delay_us >= g.delay_us - 50_000  # never sooner than its granted slot
    state = store.read_state("api")  # type: ignore[attr-defined]
    assert state is not None and state.pushed_us == INTERVAL_US
