"""Bad input names itself: bad intervals and store URLs raise ConfigurationError with the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from celery_interval.errors import ConfigurationError
from celery_interval.intervals import parse_interval_us
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
