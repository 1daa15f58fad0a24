"""The exporter and ``interval top`` on real stores, brokers and ``celery worker`` processes."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner

from celery_interval.config.table import KEY_PREFIX
from celery_interval.demo.embedded import RedisProc, _free_port
from celery_interval.monitor.events import StoreCallEvents
from celery_interval.stores import keys
from tests.helpers.exporter import (
    parse_metrics,
    serving_exporter,
    top_shows_the_ledger_and_the_store,
    values,
    wait_for,
    write_starts,
)
from tests.helpers.pool import Pool, celery_cli

# --- interval top on a real store -------------------------------------------------------


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, redis_server: Any, redis_client: Any) -> Any:
    """``celery -A tests.helpers.cliapp:app interval …`` (queues api 1 s, mail 2 s)."""
    monkeypatch.setenv("CLI_TEST_BROKER", redis_server.broker_url_for(4))
    monkeypatch.setenv("CLI_TEST_STORE", redis_server.url_for(0))
    from celery.bin.celery import celery

    def invoke(*args: str) -> Any:
        sys.modules.pop("tests.helpers.cliapp", None)
        return CliRunner().invoke(celery, ["-A", "tests.helpers.cliapp:app", "interval", *args])

    return invoke


def test_top_once_and_json_show_the_ledger_and_the_store(
    run: Any, redis_client: redis.Redis[Any]
) -> None:
    top_shows_the_ledger_and_the_store(run, redis_client)


def test_the_metrics_of_a_hand_written_ledger(run: Any, redis_client: redis.Redis[Any]) -> None:
    """The exporter's metrics of a real store whose ledger shows a violation, then another."""
    from prometheus_client import CollectorRegistry, generate_latest

    from celery_interval.monitor.collector import Collector
    from celery_interval.monitor.prometheus import FrameMetrics

    run("status", "--timeout", "0.1")  # imports the CLI app with the environment set
    app = sys.modules["tests.helpers.cliapp"].app
    last = write_starts(redis_client, "api", [1_000_000] * 3, 1_000_000)
    redis_client.set(keys.born_key(KEY_PREFIX), 0)  # an old store: a new bucket's budgets full
    collector = Collector(app, inspect_timeout_s=0.1, rescan_s=0.0)
    metrics, registry = FrameMetrics(), CollectorRegistry(auto_describe=False)
    registry.register(metrics)

    def scrape() -> dict[Any, float]:
        metrics.update(collector.refresh())
        return parse_metrics(generate_latest(registry).decode())

    first = scrape()
    assert values(first, "celery_interval_starts_total") == {"api": 4, "mail": 0}
    assert values(first, "celery_interval_claim_violations_total") == {"api": 0, "mail": 0}
    assert values(first, "celery_interval_interval_seconds") == {"api": 1.0, "mail": 2.0}
    assert values(first, "celery_interval_burst") == {"api": 3, "mail": 1}
    per_limit = {
        (name, dict(labels)["bucket"], dict(labels)["limit"]): value
        for (name, labels), value in first.items()
        if name.startswith("celery_interval_limit_")
    }
    assert per_limit == {
        ("celery_interval_limit_interval_seconds", "api", "100/min"): 0.6,
        ("celery_interval_limit_interval_seconds", "api", "1000/h burst 50"): 3.6,
        ("celery_interval_limit_burst", "api", "100/min"): 1,
        ("celery_interval_limit_burst", "api", "1000/h burst 50"): 50,
        ("celery_interval_limit_budget_units", "api", "100/min"): 1,
        ("celery_interval_limit_budget_units", "api", "1000/h burst 50"): 50,
    }
    assert values(first, "celery_interval_budget_units") == {"api": 3, "mail": 1}
    nexts = values(first, "celery_interval_next_slot_seconds")
    assert sorted(nexts) == ["api", "mail"] and all(0 <= s <= 2.0 for s in nexts.values())
    assert values(first, "celery_interval_paused") == {"api": 0, "mail": 0}
    assert values(first, "celery_interval_held") == {"api": 0, "mail": 0}
    assert values(first, "celery_interval_start_lateness_seconds_count") == {"api": 4, "mail": 0}
    # two more: one interval after the last start read, then 0.4 s later (a violation)
    last = write_starts(redis_client, "api", [400_000], 1_000_000, first_us=last + 1_000_000)
    second = scrape()
    assert values(second, "celery_interval_starts_total")["api"] == 6
    assert values(second, "celery_interval_claim_violations_total") == {"api": 1, "mail": 0}
    # two counted against "20/min" (3 s): 1.5 s apart keeps the interval, breaks the limit
    limits = {"limits": "3000000:1,3600000:50"}
    write_starts(redis_client, "api", [1_500_000], 1_000_000, first_us=last + 2_000_000, **limits)
    third = scrape()
    assert values(third, "celery_interval_claim_violations_total") == {"api": 2, "mail": 0}
    broken = {
        dict(labels)["limit"]: value
        for (name, labels), value in third.items()
        if name == "celery_interval_limit_violations_total"
    }
    assert broken == {"20/min": 1}
    labels = {dict(k[1]).get("queue") for k in second if k[0] == "celery_interval_starts_total"}
    assert labels == {"api", "mail"}
    collector.stop()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("top", "--window", "0"), "0.0"),
        (("top", "--match", ""), "''"),
        (("exporter", "--port", "70000"), "70000"),
        (("exporter", "--interval", "-1"), "-1"),
    ],
)
def test_bad_options_fail_naming_the_value(run: Any, args: tuple[str, ...], named: str) -> None:
    result = run(*args)
    assert result.exit_code == 2
    assert named in result.output


def test_an_address_it_cannot_listen_on_fails_in_one_line(run: Any) -> None:
    result = run("exporter", "--addr", "256.0.0.1", "--port", str(_free_port()))
    assert result.exit_code == 1
    assert result.output.startswith("Error: --addr='256.0.0.1'") and result.output.count("\n") == 1


# --- the store call events -----------------------------------------------------------------


def test_store_call_events_fill_the_histograms(redis_server: RedisProc) -> None:
    """Events sent by a real dispatcher over a real (Redis) broker reach the consumer."""
    app = Celery("events", broker=redis_server.broker_url_for(6), set_as_current=False)
    events = StoreCallEvents(app, match="api*")
    events.start()
    try:
        assert events.ready.wait(30), "the event consumer never became ready"
        sent = [("interval-granted", "grant", 0.0004), ("interval-claimed", "claim", 0.002)] * 5
        with app.events.default_dispatcher() as dispatcher:
            for kind, op, store_s in sent:
                dispatcher.send(kind, uuid=str(uuid.uuid4()), bucket="api:acme", queue="api",
                                store_op=op, store_s=store_s)  # fmt: skip
            dispatcher.send("interval-claimed", uuid="x", bucket="other", queue="other",
                            store_op="claim", store_s=0.1)  # fmt: skip
            dispatcher.send("interval-claimed", uuid="y", bucket="api")  # no call of its own
            dispatcher.send("interval-claimed", uuid="z", bucket="api", store_op="claim")
        deadline = time.monotonic() + 30
        while events.received + events.malformed < len(sent) + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        events.stop()
    histograms = events.snapshot()
    assert set(histograms) == {("api:acme", "api", "grant"), ("api:acme", "api", "claim")}
    grant = histograms["api:acme", "api", "grant"].snapshot()
    claim = histograms["api:acme", "api", "claim"].snapshot()
    assert (grant[1], grant[2]) == (5, pytest.approx(0.002))
    assert (claim[1], claim[2]) == (5, pytest.approx(0.01))
    assert dict(grant[0])[0.0005] == 5 and dict(claim[0])[0.001] == 0
    assert (events.received, events.malformed) == (10, 1)  # "other" did not match


# --- the exporter beside real workers ------------------------------------------------------


@pytest.fixture
def exporter(make_pool: Any, tmp_path: Any) -> Iterator[tuple[Pool, Any]]:
    """A pool (Redis broker, 50 ms queue, tenant keys at their task's own 100 ms) and a real
    exporter process."""
    pool = make_pool(0.05, broker="redis", env_extra={"CI_TEST_TENANT_INTERVAL": "0.1"})
    with serving_exporter(pool, tmp_path) as scrape:
        yield pool, scrape


@pytest.mark.slow
def test_the_exporter_counts_what_real_workers_ran(exporter: tuple[Pool, Any]) -> None:
    pool, scrape = exporter
    pool.start(2, concurrency=2, args=("-E",))  # task events on: the store call times too
    assert celery_cli(pool, "interval", "pause", pool.queue).returncode == 0
    n_queue, keys, per_key = 30, ("acme", "globex"), 10
    pool.send(n_queue)
    with pool.app.producer_or_acquire() as producer:
        for key in keys:
            for i in range(per_key):
                pool.app.send_task("workerapp.tenant", args=(key, i), queue=pool.queue,
                                   producer=producer)  # fmt: skip
    q = pool.queue
    held = wait_for(scrape, lambda m: values(m, "celery_interval_held").get(q, 0) > 0, "held")
    assert values(held, "celery_interval_held")[q] > 0
    assert values(held, "celery_interval_paused")[q] == 1
    assert values(held, "celery_interval_interval_seconds")[q] == pytest.approx(0.05)
    assert celery_cli(pool, "interval", "unpause", pool.queue).returncode == 0

    records = pool.wait_records(n_queue)
    tenant_records = pool.wait_records(len(keys) * per_key, kind="tenant")
    bodies = {q: len(records)}
    for key in keys:
        bodies[f"{q}:{key}"] = sum(1 for r in tenant_records if r["args"][0] == key)

    def store_calls(m: dict[Any, float]) -> dict[str, float]:
        """Store calls timed per bucket, whatever the operation."""
        calls: dict[str, float] = {}
        for (name, labels), v in m.items():
            if name == "celery_interval_store_call_seconds_count":
                bucket = dict(labels)["bucket"]
                calls[bucket] = calls.get(bucket, 0) + v
        return calls

    def caught_up(m: dict[Any, float]) -> bool:
        starts = values(m, "celery_interval_starts_total")
        readmits = values(m, "celery_interval_readmits_total")
        calls = store_calls(m)
        return all(
            starts.get(b, 0) - readmits.get(b, 0) >= n and calls.get(b, 0) >= n
            for b, n in bodies.items()
        )

    metrics = wait_for(scrape, caught_up, "the starts")
    starts = values(metrics, "celery_interval_starts_total")
    readmits = values(metrics, "celery_interval_readmits_total")
    # a readmit is a second start of a body whose first admitted start passed unheard
    assert {b: starts[b] - readmits[b] for b in bodies} == bodies
    assert sum(bodies.values()) == n_queue + len(keys) * per_key
    assert set(values(metrics, "celery_interval_claim_violations_total").values()) == {0}
    assert values(metrics, "celery_interval_paused")[q] == 0
    assert values(metrics, "celery_interval_waiting")[q] == 0  # all ran: an empty queue
    intervals = values(metrics, "celery_interval_interval_seconds")
    tenants = {f"{q}:{key}": 0.1 for key in keys}  # the tenant task's own interval
    assert {b: intervals[b] for b in bodies} == pytest.approx({q: 0.05, **tenants})
    grants = values(metrics, "celery_interval_grants_total")
    assert all(grants[b] >= n for b, n in bodies.items())
    lateness = values(metrics, "celery_interval_start_lateness_seconds_count")
    assert lateness[q] == starts[q]
    assert values(metrics, "celery_interval_ledger_gaps_total")[q] == 0
    # every start took a ticket by a timed grant or take: as many calls as bodies at least
    assert all(store_calls(metrics).get(b, 0) >= n for b, n in bodies.items())
    fleet = {name: v for (name, labels), v in metrics.items() if not labels}
    assert fleet["celery_interval_up"] == 1 and fleet["celery_interval_workers"] == 2
