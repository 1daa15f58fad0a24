"""Export bucket ledgers (capped Redis Streams) as JSON lines that Spark reads directly."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from redis.exceptions import RedisClusterException, RedisError

from celery_interval.config import settings_of
from celery_interval.config.intervals import US_PER_S
from celery_interval.config.table import KEY_PREFIX
from celery_interval.errors import ConfigurationError, StoreUnavailable
from celery_interval.stores import keys, mask_url
from celery_interval.stores.codec import as_text
from celery_interval.stores.redis import RedisStore
from celery_interval.stores.redis_client import RedisClient, client_for_url
from celery_interval.stores.redis_nested import Nesting
from celery_interval.stores.urls import CLUSTER_SCHEMES, is_redis_url, is_sentinel_url

__all__ = [
    "DEFAULT_CHUNK",
    "DEFAULT_PART_ENTRIES",
    "TEXT_FIELDS",
    "ExportResult",
    "LedgerReader",
    "entry_record",
    "export",
    "id_key",
    "parse_since_us",
    "reader_for_app",
]

#: Entry fields kept as text; every other field is an integer (µs, ticket, count or flag).
TEXT_FIELDS = frozenset({"op", "task", "holder", "limits"})
#: Entries per XRANGE round trip.
DEFAULT_CHUNK = 5_000
#: Entries per part file when exporting to a directory.
DEFAULT_PART_ENTRIES = 1_000_000
#: A stream id's milliseconds may trail the entry's ``now`` (Redis freezes the command time
#: at the script's start; ``now`` is read inside it): start XRANGE this much earlier.
_SINCE_MARGIN_MS = 1_000
_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT_US = {"s": US_PER_S, "m": 60 * US_PER_S, "h": 3600 * US_PER_S, "d": 86400 * US_PER_S}
_PART = re.compile(r"^part-\d+\.jsonl$")


def entry_record(bucket: str, entry_id: str, fields: dict[str, str]) -> dict[str, Any]:
    """One ledger entry as a JSON-ready dict: ``bucket``, ``id``, then its fields typed."""
    record: dict[str, Any] = {"bucket": bucket, "id": entry_id}
    for name, value in fields.items():
        if name in TEXT_FIELDS:
            record[name] = value
        else:
            try:
                record[name] = int(value)
            except ValueError:
                record[name] = value
    return record


def id_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id (``<ms>-<seq>``) as a pair that sorts as the stream does."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class LedgerReader:
    """Pages through the ledgers of one Redis store (standalone, Sentinel or Cluster) in
    bounded XRANGE chunks."""

    def __init__(
        self,
        client: RedisClient | Callable[[], RedisClient],
        key_prefix: str = KEY_PREFIX,
        nesting: Nesting | None = None,
    ) -> None:
        """``client``: a redis-py client, or a function making one on first use (a Cluster
        client connects as it is made). ``nesting``: the app's nested buckets
        (a declaration's ``outer``), whose ledgers' keys carry their outer's tag."""
        self._prefix = keys.validate_prefix(key_prefix)
        self._store = RedisStore(client, key_prefix=self._prefix, nesting=nesting)

    @property
    def _client(self) -> Any:
        return self._store.client()

    def buckets(self) -> list[str]:
        """Every bucket that has a ledger under the prefix, found by SCAN (never KEYS; on a
        Cluster, redis-py's ``scan_iter`` scans every primary)."""
        found: set[str] = set()
        with self._errors("scan"):
            for key in self._client.scan_iter(
                match=keys.ledger_key_pattern(self._prefix), count=1000, _type="stream"
            ):
                bucket = keys.bucket_of_ledger_key(self._prefix, key)
                if bucket:
                    found.add(bucket)
        return sorted(found)

    def client(self) -> Any:
        """The redis-py client the reader pages with (a ``RedisCluster`` on a Cluster store),
        for a follower of the streams; made on first use."""
        return self._client

    def ledger_key(self, bucket: str) -> str:
        """The key of ``bucket``'s ledger Stream."""
        return self._store.ledger_key(bucket)

    @contextlib.contextmanager
    def guard(self, op: str) -> Iterator[None]:
        """Raise redis-py's errors during ``op`` as ``StoreUnavailable``."""
        with self._errors(op):
            yield

    def now_us(self) -> int:
        """The store's clock (Redis ``TIME``) in µs: what ``now`` in the entries is read from."""
        with self._errors("time"):
            seconds, micros = self._client.time()
        return int(seconds) * US_PER_S + int(micros)

    def entries(
        self, bucket: str, since_us: int | None = None, chunk: int = DEFAULT_CHUNK
    ) -> Iterator[dict[str, Any]]:
        """``bucket``'s entries oldest first (``now >= since_us`` when given), as
        ``entry_record`` dicts, up to the newest entry when the iteration began."""
        if chunk < 1:
            raise ConfigurationError(f"chunk={chunk!r}: expected an integer >= 1")
        with self._errors("xrevrange"):
            newest: Any = self._client.xrevrange(self._store.ledger_key(bucket), count=1)
        if not newest:
            return
        end = id_key(as_text(newest[0][0]))
        start = "-" if since_us is None else f"{max(0, since_us // 1000 - _SINCE_MARGIN_MS)}-0"
        while True:
            page = self._store.ledger(bucket, start_id=start, count=chunk)
            for entry_id, fields in page:
                if id_key(entry_id) > end:
                    return
                record = entry_record(bucket, entry_id, fields)
                if since_us is None or int(record.get("now", 0)) >= since_us:
                    yield record
            if len(page) < chunk:
                return
            start = "(" + page[-1][0]

    def close(self) -> None:
        self._store.close()

    @contextlib.contextmanager
    def _errors(self, op: str) -> Iterator[None]:
        try:
            yield
        except (RedisError, RedisClusterException) as exc:
            raise StoreUnavailable(f"interval store unavailable during ledger {op}: {exc}") from exc


def reader_for_app(app: Any) -> LedgerReader:
    """A reader of the app's store (``interval_store_url``, ``interval_key_prefix``): a
    standalone, Sentinel or Cluster Redis store; a Cluster's client connects on first use."""
    settings = settings_of(app)
    url = settings.require_store_url()
    cluster = urlsplit(url).scheme.lower() in CLUSTER_SCHEMES
    if not (is_redis_url(url) or is_sentinel_url(url) or cluster):
        raise ConfigurationError(
            f"interval_store_url={mask_url(url)!r} keeps no ledger: only a Redis store "
            "(redis://, rediss://, unix://, redis+sentinel://, redis+cluster://) does"
        )
    client = client_for_url(url, mask_url(url), settings.store_timeout_s)
    nesting = settings.outer_of if settings.nested else None
    return LedgerReader(client, settings.key_prefix, nesting)


def parse_since_us(value: str, now_us: int) -> int:
    """``--since`` as store-clock µs: ``30m``/``2h``/``1d``/``90s`` before ``now_us``, an ISO
    8601 time (naive means UTC) or Unix seconds."""
    text = value.strip()
    relative = _RELATIVE.match(text)
    if relative:
        return now_us - round(float(relative.group(1)) * _UNIT_US[relative.group(2)])
    try:
        return round(float(text) * US_PER_S)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        raise ConfigurationError(
            f"--since={value!r}: expected a duration ago (90s, 30m, 2h, 1d), an ISO 8601 time "
            "(2026-01-31T12:00:00Z) or Unix seconds"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return round(when.timestamp() * US_PER_S)


@dataclass
class ExportResult:
    """What an export wrote: entry counts per bucket and the files (none for stdout)."""

    per_bucket: dict[str, int] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)

    @property
    def entries(self) -> int:
        return sum(self.per_bucket.values())


class _Parts:
    """JSON lines into one file, stdout, or rotating part files of a directory; each file is
    written under a hidden temporary name (readers skip it) and renamed when complete."""

    def __init__(self, out: str, part_entries: int) -> None:
        if part_entries < 1:
            raise ConfigurationError(f"part_entries={part_entries!r}: expected an integer >= 1")
        self.files: list[Path] = []
        self._part_entries = part_entries
        self._stream: IO[str] | None = None
        self._tmp: Path | None = None
        self._target: Path | None = None
        self._in_part = 0
        self._stdout = out == "-"
        self._directory: Path | None = None
        if self._stdout:
            return
        path = Path(out)
        if out.endswith(("/", os.sep)) or path.is_dir():
            self._directory = path
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigurationError(f"--out={out!r}: cannot create directory: {exc}") from None
            if any(_PART.match(p.name) for p in path.iterdir()):
                raise ConfigurationError(
                    f"--out={out!r} already holds part files: export into an empty directory"
                )
        else:
            self._open(path)

    def write(self, record: dict[str, Any]) -> None:
        if self._stdout:
            sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
            return
        if self._directory is not None and (
            self._stream is None or self._in_part >= self._part_entries
        ):
            self._finish()
            self._open(self._directory / f"part-{len(self.files):05d}.jsonl")
        assert self._stream is not None
        self._stream.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._in_part += 1

    def close(self) -> None:
        if self._stdout:
            sys.stdout.flush()
            return
        self._finish()
        if self._directory is not None:
            (self._directory / "_SUCCESS").touch()

    def abort(self) -> None:
        if self._stream is not None and self._tmp is not None:
            self._stream.close()
            self._tmp.unlink(missing_ok=True)
            self._stream = None

    def _open(self, target: Path) -> None:
        tmp = target.with_name(f".{target.name}.tmp")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            self._stream = tmp.open("w", encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"--out={str(target)!r}: cannot write: {exc}") from None
        self._tmp, self._target, self._in_part = tmp, target, 0

    def _finish(self) -> None:
        if self._stream is None or self._tmp is None or self._target is None:
            return
        self._stream.close()
        os.replace(self._tmp, self._target)
        self.files.append(self._target)
        self._stream = None


def export(
    reader: LedgerReader,
    out: str,
    *,
    buckets: Sequence[str] | None = None,
    since_us: int | None = None,
    chunk: int = DEFAULT_CHUNK,
    part_entries: int = DEFAULT_PART_ENTRIES,
) -> ExportResult:
    """Write the ledgers of ``buckets`` (default: every bucket found) as JSON lines to ``out``:
    a file, ``-`` (stdout), or a directory (existing, or ending in ``/``) of part files with at
    most ``part_entries`` entries each and a ``_SUCCESS`` marker once complete."""
    names = list(buckets) if buckets else reader.buckets()
    for name in names:
        keys.validate_bucket(name)
    sink = _Parts(out, part_entries)
    result = ExportResult()
    try:
        for bucket in names:
            result.per_bucket[bucket] = 0
            for record in reader.entries(bucket, since_us=since_us, chunk=chunk):
                sink.write(record)
                result.per_bucket[bucket] += 1
    except BaseException:
        sink.abort()
        raise
    sink.close()
    result.files = sink.files
    return result
