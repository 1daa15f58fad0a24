"""Bucket declarations in ``interval_queues``: the forms, the one lookup's fallback order, the
task option's fields winning, and every refusal naming the key, the value and the closest
valid name (at load, which the worker's start and a send both go through, and at send)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_interval import Bucket, IntervalTask
from celery_interval.config import settings_of
from celery_interval.config.table import FIELDS, MOVED
from celery_interval.errors import ConfigurationError, UnknownBucket
from celery_interval.placement import own_of
from celery_interval.schedule import Limit
from celery_interval.schedule.outer import Outer


def _app(queues: Any, **conf: Any) -> Celery:
    app = Celery("declared", broker="memory://", set_as_current=False)
    app.conf.update(interval_store_url="memory://", interval_queues=queues, **conf)
    return app


def _refused(queues: Any, **conf: Any) -> str:
    with pytest.raises(ConfigurationError) as info:
        settings_of(_app(queues, **conf))
    return str(info.value)


def test_a_bucket_object_and_a_mapping_declare_the_same() -> None:
    fields = {
        "interval": "10/s",
        "burst": 5,
        "limits": ["100/min", ("1000/h", 50)],
        "concurrency": 4,
        "adaptive": "1/min",
        "interactive_share": 0.2,
    }
    by_map = settings_of(_app({"api": fields}))
    by_object = settings_of(_app({"api": Bucket(**fields)}))
    assert by_map.declarations == by_object.declarations
    assert {f.name for f in FIELDS} == {*fields, "outer", "fair", "weight"}
    s = by_object
    assert (s.interval_us("api"), s.burst_of("api"), s.concurrency_of("api")) == (100_000, 5, 4)
    assert s.limits_of("api") == (Limit(600_000), Limit(3_600_000, 50))
    assert (s.adapt_max_us("api", 100_000), s.share_of("api")) == (60_000_000, 0.2)


def test_a_tenant_field_comes_from_its_entry_then_the_pattern_then_the_queue() -> None:
    s = settings_of(
        _app(
            {
                "api": {"interval": "10/s", "burst": 2, "concurrency": 8, "adaptive": True},
                "api:*": {"interval": "1/s", "burst": 3},
                "api:vip": {"burst": 9, "adaptive": False},
            }
        )
    )
    assert [s.burst_of(b) for b in ("api", "api:acme", "api:vip")] == [2, 3, 9]
    assert [s.interval_us(b) for b in ("api", "api:acme", "api:vip")] == [
        100_000,
        1_000_000,
        1_000_000,
    ]
    assert [s.concurrency_of(b) for b in ("api", "api:acme", "api:vip")] == [8, 8, 8]
    assert s.adapt_max_us("api:acme", 1_000_000) == 100_000_000
    assert s.adapt_max_us("api:vip", 1_000_000) is None, "False in its own entry wins"
    assert s.buckets() == ["api", "api:vip"], "a pattern is not a bucket"


def test_outer_comes_from_the_entry_or_the_pattern_never_the_queue() -> None:
    s = settings_of(
        _app(
            {
                "acct": 0.01,
                "api": {"interval": "10/s", "outer": "acct"},
                "mail": "1/s",
                "mail:*": {"outer": "mail"},
                "mail:own": {"outer": "acct"},
            }
        )
    )
    assert s.outer_name("api") == "acct"
    assert s.outer_name("api:acme") is None
    assert (s.outer_name("mail:acme"), s.outer_name("mail:own")) == ("mail", "acct")
    assert s.outer_name("mail") is None


def test_a_fair_outers_keys_carry_their_weight_from_the_entry_the_pattern_or_a_callable() -> None:
    plans = {"api:gold": 3}
    s = settings_of(
        _app(
            {
                "api": {"interval": "50/s", "fair": True, "burst": 2},
                "api:*": {"outer": "api", "weight": lambda key: plans.get(key, 1)},
                "api:vip": {"weight": 5},
                "mail": "1/s",
                "mail:*": {"outer": "mail"},
            }
        )
    )
    weights = [s.outer_of(b).weight for b in ("api:acme", "api:gold", "api:vip")]  # type: ignore[union-attr]
    assert weights == [1, 3, 5]
    assert s.outer_of("api:acme") == Outer("api", 20_000, 2, (), 1)
    assert s.outer_of("mail:acme") == Outer("mail", 1_000_000), "not fair: no weight"
    plans["api:acme"] = 0
    with pytest.raises(
        ConfigurationError, match=r"interval_queues\['api:\*'\]\['weight'\]\('api:acme'\)=0"
    ):
        s.outer_of("api:acme")


def test_the_task_option_wins_field_by_field() -> None:
    app = _app({"api": {"interval": "10/s", "burst": 2, "limits": ["100/min"], "concurrency": 8}})

    @app.task(base=IntervalTask, name="declared.own", interval={"burst": 5, "concurrency": 1})
    def own() -> None: ...

    @app.task(base=IntervalTask, name="declared.typed", interval=Bucket(interval=2))
    def typed() -> None: ...

    s, mine = settings_of(app), own_of(own)
    assert (s.burst_of("api", mine), s.concurrency_of("api", mine)) == (5, 1)
    assert (s.interval_us("api", mine), s.limits_of("api", mine)) == (100_000, (Limit(600_000),))
    assert s.interval_us("api", own_of(typed)) == 2_000_000
    assert s.burst_of("api", own_of(typed)) == 2


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ({"burts": 5}, "declared.bad.interval: unknown option 'burts'; did you mean 'burst'?"),
        ({"outer": "api"}, "declared.bad.interval: 'outer' is the bucket's, not a task's"),
        ({"burst": 0}, "declared.bad.interval['burst']=0: expected an integer >= 1"),
    ],
)
def test_a_bad_task_option_is_refused_when_bound(option: Any, expected: str) -> None:
    app = _app({"api": 1})
    with pytest.raises(ConfigurationError) as info:

        @app.task(base=IntervalTask, name="declared.bad", interval=option, shared=False)
        def bad() -> None: ...

        bad.run  # noqa: B018 (binds the lazy task)
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("queues", "expected"),
    [
        (
            {"api": {"interval": 1, "burts": 5}},
            "interval_queues['api']: unknown option 'burts'; did you mean 'burst'?",
        ),
        (
            {"api": {"interval": 1, "zzz": 5}},
            "interval_queues['api']: unknown option 'zzz'; the options are interval, burst",
        ),
        (
            {"api": 1, "apii:*": {"burst": 2}},
            "interval_queues['apii:*']: no queue 'apii' is declared; did you mean 'api:*'?",
        ),
        (
            {"api": 1, "apx:vip": {"burst": 2}},
            "interval_queues['apx:vip']: no queue 'apx' is declared; did you mean 'api:vip'?",
        ),
        (
            {"api": 1, "api:*": {"outer": "apii"}},
            "interval_queues['api:*']['outer']='apii': no queue 'apii' is declared; "
            "did you mean 'api'?",
        ),
        (
            {"api": {"burst": 2}},
            "interval_queues['api']={'burst': 2}: a queue's declaration needs an 'interval'",
        ),
        (
            {"api": {"interval": 1, "fair": True}},
            "interval_queues['api']['fair']=True: no bucket is nested in 'api'",
        ),
        (
            {"api": {"interval": 1, "fair": "yes"}},
            "interval_queues['api']['fair']='yes': expected True or False",
        ),
        (
            {"api": 1, "api:*": {"outer": "api", "weight": 2}},
            "interval_queues['api:*']['weight']: a weight is a nested bucket's share of a fair "
            "outer bucket, and its outer 'api' is not fair",
        ),
        (
            {"api": 1, "api:vip": {"weight": 2}},
            "interval_queues['api:vip']['weight']: a weight is a nested bucket's share of a fair "
            "outer bucket, and it is not nested",
        ),
        (
            {"api": {"interval": 1, "fair": True}, "api:*": {"outer": "api", "weight": 0}},
            "interval_queues['api:*']['weight']=0",
        ),
        ({"api": {"interval": "fast"}}, "interval_queues['api']['interval']='fast'"),
        ({"api": {"interval": 1, "adaptive": "x"}}, "interval_queues['api']['adaptive']='x'"),
        ({"api": {"interval": 1, "limits": "1/s"}}, "interval_queues['api']['limits']='1/s'"),
        (["api"], "interval_queues=['api']: expected a mapping of queue"),
        ({"": 1}, "interval_queues key '': expected a queue"),
    ],
)
def test_a_bad_declaration_is_refused_naming_key_value_and_the_closest(
    queues: Any, expected: str
) -> None:
    assert expected in _refused(queues)


@pytest.mark.parametrize(("key", "field"), [(key, field) for key, (field, _) in MOVED.items()])
def test_a_moved_setting_is_refused_saying_where_it_went(key: str, field: str) -> None:
    message = _refused({"api": 1}, **{key: {"api": 1}})
    assert message.startswith(f"{key} is no longer a setting: declare the {field} in ")
    assert f"'{field}': " in message


def test_the_burst_example_reads_as_the_docs_say() -> None:
    assert _refused({"api": 1}, interval_burst={"apii": 5}) == (
        "interval_burst is no longer a setting: declare the burst in interval_queues, "
        "e.g. {'api': {'interval': '10/s', 'burst': 5}}"
    )


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("interval_queue", "interval_queue={'api': 1}: not a setting; did you mean "
         "'interval_queues'?"),
        ("interval_lease", "interval_lease={'api': 1}: not a setting; did you mean "
         "'interval_lease_s'?"),
        ("interval_zzz", "interval_zzz={'api': 1}: not a setting"),
    ],
)  # fmt: skip
def test_an_unknown_interval_setting_is_refused_with_the_closest(key: str, expected: str) -> None:
    assert _refused({"api": 1}, **{key: {"api": 1}}) == expected


def test_celerys_own_settings_are_left_alone() -> None:
    settings_of(_app({"api": 1}, task_default_queue="api", worker_prefetch_multiplier=1))


def test_a_send_to_a_bucket_with_no_interval_is_refused_with_the_closest() -> None:
    app = _app({"api": 1, "mail": "30/m"}, task_default_queue="api")

    @app.task(base=IntervalTask, name="declared.call")
    def call() -> None: ...

    @app.task(base=IntervalTask, name="declared.paced", interval=2)
    def paced() -> None: ...

    call.apply_async()  # the default queue, declared
    call.apply_async(queue="mail")
    paced.apply_async(queue="nowhere")  # the task declares its own interval
    with pytest.raises(UnknownBucket) as info:
        call.apply_async(interval_bucket="apii")
    assert str(info.value) == (
        "task declared.call: bucket 'apii' has no interval declared in interval_queues; "
        "did you mean 'api'?"
    )
    with pytest.raises(UnknownBucket, match=r"bucket 'maill' has no interval declared .* 'mail'"):
        call.apply_async(queue="maill")


def test_a_send_validates_the_settings() -> None:
    app = _app({"api": 1}, task_default_queue="api", interval_lease=3)

    @app.task(base=IntervalTask, name="declared.sent")
    def sent() -> None: ...

    with pytest.raises(ConfigurationError, match="interval_lease=3: not a setting"):
        sent.apply_async()


def test_a_producer_sends_without_a_store_url_and_a_store_asks_for_one() -> None:
    """A producer on RabbitMQ needs no store to send (a send loads the settings to check
    them); anything that opens the store names the missing setting."""
    from celery_interval.stores import store_for_settings

    app = Celery("producer", broker="amqp://guest@127.0.0.1//", set_as_current=False)
    app.conf.update(interval_queues={"api": 1}, task_default_queue="api")
    settings = settings_of(app)
    assert settings.store_url == ""
    with pytest.raises(ConfigurationError, match="interval_store_url is not set"):
        store_for_settings(settings)


def test_a_tasks_own_declaration_is_parsed_once_and_follows_its_option() -> None:
    from types import SimpleNamespace

    task = SimpleNamespace(name="declared.own", interval={"interval": 1, "burst": 2})
    first = own_of(task)
    assert first is not None and first.interval_us == 1_000_000
    assert own_of(task) is first
    task.interval = "2s"
    again = own_of(task)
    assert again is not None and again.interval_us == 2_000_000
