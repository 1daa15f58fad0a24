"""A nested bucket's status shows its outer bucket: paused while the outer is, its next slot
no sooner than the outer budget's; on the memory store and on a real Redis."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner

from celery_interval import control
from celery_interval.app_store import store_of
from celery_interval.config.table import KEY_PREFIX
from celery_interval.schedule import Pace
from celery_interval.stores import keys
from celery_interval.stores.base import TaskCopy

TENANT_S = 0.1
OUTER_S = 2.0


@pytest.fixture(params=["memory", "redis"])
def app(request: pytest.FixtureRequest) -> Iterator[Celery]:
    """An app whose tenants ``api:*`` (0.1 s each) nest in the account ``acct`` (2 s), its
    module importable by ``celery -A``."""
    if request.param == "redis":
        client = request.getfixturevalue("redis_client")
        client.set(keys.born_key(KEY_PREFIX), 0)  # an old store: a first start may come at once
        url = request.getfixturevalue("redis_server").url_for(0)
    else:
        url = "memory://"
    app = Celery("nestedstatus", broker="memory://", set_as_current=False)
    app.conf.update(
        interval_store_url=url,
        interval_queues={"api": TENANT_S, "api:*": {"outer": "acct"}, "acct": OUTER_S},
    )
    module = types.ModuleType("nested_status_app")
    module.app = app  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        yield app
    finally:
        del sys.modules[module.__name__]
        store_of(app).close()


def _grant(app: Celery, bucket: str, task_id: str) -> None:
    store_of(app).grant(TaskCopy(bucket, task_id, 0), control.configured_pace(app, bucket))


def test_a_tenant_reads_paused_while_its_outer_bucket_is(app: Celery) -> None:
    _grant(app, "api:acme", "t1")
    assert not control.status(app, "api:acme").paused
    control.pause(app, "acct", broadcast=False)
    tenant = control.status(app, "api:acme")
    assert (tenant.paused, tenant.outer, tenant.outer_paused) == (True, "acct", True)
    [(name, listed)] = control.statuses(app, "api:*")[0]
    assert name == "api:acme" and listed.outer_paused, listed
    assert not store_of(app).status("api:acme", round(TENANT_S * 1e6)).paused, "its own record"
    control.unpause(app, "acct", broadcast=False)
    tenant = control.status(app, "api:acme")
    assert (tenant.paused, tenant.outer_paused) == (False, False)


def test_the_control_replies_of_a_tenant_show_its_outer_bucket(app: Celery) -> None:
    """pause, unpause, set and unset of api:acme answer as its status reads: still paused by
    the account after its own unpause, its next slot no sooner than the account's."""
    _grant(app, "api:acme", "t1")
    control.pause(app, "acct", broadcast=False)
    paused = control.pause(app, "api:acme", broadcast=False)
    assert (paused.paused, paused.outer, paused.outer_paused) == (True, "acct", True)
    unpaused = control.unpause(app, "api:acme", broadcast=False)
    assert (unpaused.paused, unpaused.outer_paused) == (True, True), "the account still is"
    assert control.set_interval(app, "api:acme", 0.2, broadcast=False).outer_paused
    assert control.unset_interval(app, "api:acme", broadcast=False).status.outer_paused
    control.unpause(app, "acct", broadcast=False)
    again = control.unpause(app, "api:acme", broadcast=False)
    assert (again.paused, again.outer, again.outer_paused) == (False, "acct", False)
    assert abs(again.next_slot_in_us - control.status(app, "acct").next_slot_in_us) < 50_000
    assert again.next_slot_in_us > OUTER_S * 1e6 / 2, again


def test_a_tenants_next_slot_waits_for_the_outer_budget(app: Celery) -> None:
    """A ticket of api:acme spends the account's 2 s budget: api:beta's own record would let
    its first start come at once, its status says no sooner than the account's next slot."""
    _grant(app, "api:acme", "t1")
    tenant_us = round(TENANT_S * 1e6)
    own = store_of(app).status("api:beta", tenant_us, Pace(tenant_us))
    assert own.next_slot_in_us < 500_000, own
    acct = control.status(app, "acct")
    beta = control.status(app, "api:beta")
    assert beta.next_slot_in_us > OUTER_S * 1e6 / 2, beta
    assert abs(beta.next_slot_in_us - acct.next_slot_in_us) < 100_000, (beta, acct)
    assert beta.units_left == own.units_left, "the units left stay the tenant's own"


def test_the_status_command_shows_the_outer_pause(app: Celery) -> None:
    from celery.bin.celery import celery

    _grant(app, "api:acme", "t1")
    control.pause(app, "acct", broadcast=False)

    def run(*args: str) -> str:
        argv = ["-A", "nested_status_app:app", "interval", "status", *args, "--timeout", "0.1"]
        result = CliRunner().invoke(celery, argv)
        assert result.exit_code == 0, result.output
        return str(result.output)

    [row] = json.loads(run("api:acme", "--json"))["queues"]
    assert (row["paused"], row["outer"], row["outer_paused"]) == (True, "acct", True), row
    assert "by acct" in run("api:acme")


def test_a_bucket_that_is_not_nested_has_no_outer(app: Celery) -> None:
    found: dict[str, Any] = dict(control.statuses(app)[0])
    assert found["acct"].outer is None and not found["acct"].outer_paused


@pytest.mark.parametrize("app", ["redis"], indirect=True)
def test_the_exporter_shows_the_outer_pause_at_a_rescan_and_between(app: Celery) -> None:
    """The collector's rows (what the exporter's gauges read) of a tenant: paused with its
    outer bucket, at the rescan that finds the buckets and at the reads between rescans."""
    from celery_interval.monitor.collector import Collector

    _grant(app, "api:acme", "t1")
    control.pause(app, "acct", broadcast=False)
    collector = Collector(app, inspect_timeout_s=0.1, rescan_s=3600.0)
    for _ in range(2):  # the rescan, then a read of the known buckets
        rows = {row.bucket: row for row in collector.refresh().rows}
        assert rows["api:acme"].paused is True, rows["api:acme"]
        assert (rows["api:acme"].next_slot_in_s or 0) > 1.0
