"""Bad input names itself: bad intervals and store URLs raise ConfigurationError with the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from celery_interval.config.intervals import (
    FORMS,
    bare_seconds_note,
    describe_interval,
    parse_interval_us,
)
from celery_interval.errors import ConfigurationError
from celery_interval.stores import mask_url, store_from_url
from celery_interval.stores.file import FileStore
from celery_interval.stores.memory import MemoryStore

BAD_INTERVALS: list[object] = [
    0,
    -1,
    0.0,
    float("nan"),
    float("inf"),
    float("-inf"),
    "fast",
    "10/fortnight",
    "0/s",
    "-5/s",
    "nan",
    "inf",
    None,
    True,
    False,
    [],
    "",
    1e-9,
    "100/x",
    "2x",
    "2m",
    "2h",
    "0ms",
    "1/day",
    "500 m s",
    "1e3ms",
    "10/ms",  # no rate per millisecond, and not per minute either
    "10/ss",
]

GOOD_INTERVALS: list[tuple[object, int]] = [
    (1, 1_000_000),
    (0.5, 500_000),
    ("0.25", 250_000),
    ("10/s", 100_000),
    ("30/m", 2_000_000),
    ("100/h", 36_000_000),
    ("2/min", 30_000_000),
    (" 4 / sec ", 250_000),
    ("1/hour", 3_600_000_000),
    (0.000001, 1),
    ("500ms", 500_000),
    ("2s", 2_000_000),
    ("2 s", 2_000_000),
    (" 1.5 sec ", 1_500_000),
    ("2seconds", 2_000_000),
    ("1.5min", 90_000_000),
    ("2 minutes", 120_000_000),
    (".5s", 500_000),
    ("250MS", 250_000),
    ("10/sec", 100_000),
    ("30/min", 2_000_000),
    ("4/seconds", 250_000),
    ("2/hours", 1_800_000_000),
    (100, 100_000_000),  # a bare number is seconds between starts, however large
]


@pytest.mark.parametrize("value", BAD_INTERVALS, ids=repr)
def test_bad_interval_names_the_value(value: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_interval_us(value)
    assert repr(value) in str(info.value)


@pytest.mark.parametrize("value", BAD_INTERVALS, ids=repr)
def test_bad_interval_names_the_key(value: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_interval_us(value, name="interval_queues['api']")
    message = str(info.value)
    assert "interval_queues['api']" in message
    assert repr(value) in message


@pytest.mark.parametrize(("value", "expected_us"), GOOD_INTERVALS, ids=repr)
def test_good_interval(value: object, expected_us: int) -> None:
    assert parse_interval_us(value) == expected_us


@pytest.mark.parametrize("value", ["fast", "100/x", "2x", "", "1/day", "10/ms"])
def test_a_value_that_is_no_interval_says_what_is_meant(value: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_interval_us(value, name="interval_queues['api']")
    message = str(info.value)
    assert message.startswith(f"interval_queues['api']={value!r}: not an interval")
    assert message.endswith(FORMS)
    assert "seconds between starts (0.5, '500ms', '2s')" in FORMS
    assert "a rate of starts ('10/s', '30/m', '100/h')" in FORMS


@pytest.mark.parametrize(
    ("value", "meant"),
    [
        ("2m", "write '2min' for 2 minutes between starts, or '2/m' for 2 starts a minute"),
        ("2h", "write '120min' for 2 hours between starts, or '2/h' for 2 starts an hour"),
    ],
)
def test_minutes_and_hours_without_a_slash_are_ambiguous(value: str, meant: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_interval_us(value, name="interval")
    assert str(info.value) == f"interval={value!r}: ambiguous; {meant}"


@pytest.mark.parametrize(
    ("interval_us", "shown"),
    [
        (100_000_000, "100s (one start every 100 s = 0.01/s)"),
        (100_000, "0.1s (one start every 0.1 s = 10/s)"),
        (2_000_000, "2s (one start every 2 s = 0.5/s)"),
        (36_000_000, "36s (one start every 36 s = 0.02778/s)"),
        (1, "0.000001s (one start every 0.000001 s = 1000000/s)"),
        (1_234_567, "1.234567s (one start every 1.234567 s = 0.81/s)"),
        (86_400_000_000, "86400s (one start every 86400 s = 0.00001157/s)"),
    ],
)
def test_describe_interval_reads_both_ways(interval_us: int, shown: str) -> None:
    assert describe_interval(interval_us) == shown


@pytest.mark.parametrize(
    ("value", "noted"),
    [(100, True), ("100", True), (60.0, True), (59.9, False), ("100s", False),
     ("100/s", False), ("2min", False), (0.5, False)],
)  # fmt: skip
def test_a_long_bare_number_is_noted_as_maybe_a_rate(value: object, noted: bool) -> None:
    note = bare_seconds_note(value, parse_interval_us(value))
    if noted:
        count = str(value).removesuffix(".0")
        assert note == (
            f"note: a bare number is seconds between starts; for {count} starts a second "
            f"write {count}/s"
        )
    else:
        assert note is None


def test_configuration_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_interval_us("fast")


# -- store URLs ---------------------------------------------------------------------------

BAD_URLS: list[tuple[object, str]] = [
    ("", "''"),
    ("localhost:6379", "'localhost:6379'"),
    ("nope", "'nope'"),
    ("ftp://host/x", "'ftp://host/x'"),
    ("http://:hunter2@host", "'http://:***@host'"),
    ("file://", "'file://'"),
    ("file:///", "'file:///'"),
    ("file://otherhost/dir", "'file://otherhost/dir'"),
    ("file:relative/dir", "'file:relative/dir'"),
    ("redis:localhost", "'redis:localhost'"),
    ("redis://localhost:notaport/0", "'redis://localhost:notaport/0'"),
    ("redis://:hunter2@localhost:notaport/0", "'redis://:***@localhost:notaport/0'"),
    ("rediss://user:hunter2@host:99999999/0", "'rediss://user:***@host:99999999/0'"),
    ("redis://:hun/ter2@host/0", "'redis://:***@host/0'"),
    (None, "None"),
    (6379, "6379"),
    (b"redis://localhost", "b'redis://localhost'"),
]


@pytest.mark.parametrize(("url", "shown"), BAD_URLS, ids=repr)
def test_bad_store_url_names_it_with_password_masked(url: object, shown: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        store_from_url(url)  # type: ignore[arg-type]
    message = str(info.value)
    assert shown in message
    assert "hunter2" not in message
    assert "hun/ter2" not in message and "ter2" not in message


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://:secret@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://user:secret@host/0", "redis://user:***@host/0"),
        ("rediss://u:p@ss@host/0", "rediss://u:***@host/0"),
        ("redis://host/0?password=secret&db=1", "redis://host/0?password=***&db=1"),
        ("redis://user@host/0", "redis://user@host/0"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("file:///data/a:b@c", "file:///data/a:b@c"),
        ("memory://", "memory://"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_good_store_urls(tmp_path: Path) -> None:
    assert isinstance(store_from_url("memory://"), MemoryStore)
    directory = tmp_path / "shared" / "interval"
    store = store_from_url(f"file://{directory}")
    assert isinstance(store, FileStore)
    assert store.directory == directory
    assert directory.is_dir()  # created
    assert isinstance(store_from_url(f"file://localhost{directory}"), FileStore)


def test_redis_url_builds_a_redis_store_lazily() -> None:
    from celery_interval.stores.redis import RedisStore

    store = store_from_url("redis://:secret@127.0.0.1:1/0", key_prefix="x:", timeout_s=0.1)
    assert isinstance(store, RedisStore)
    store.close()
