"""Every Redis key celery_interval uses, built in one place and hash-tagged by bucket."""

from __future__ import annotations

from celery_interval.errors import ConfigurationError

__all__ = [
    "born_key",
    "bucket_of_ledger_key",
    "bucket_of_state_key",
    "ledger_key",
    "ledger_key_pattern",
    "mark_key",
    "places_key",
    "settle_key",
    "state_key",
    "state_key_pattern",
    "task_keys",
    "validate_bucket",
    "validate_prefix",
]


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is usable: braces would break the per-bucket hash tag."""
    if not isinstance(prefix, str):
        raise ConfigurationError(f"key prefix must be a string, got {prefix!r}")
    if "{" in prefix or "}" in prefix:
        raise ConfigurationError(
            f"key prefix {prefix!r} must not contain '{{' or '}}' (keys are hash-tagged by bucket)"
        )
    return prefix


def validate_bucket(bucket: str) -> str:
    """Return ``bucket`` if non-empty: ``{}`` is no hash tag, so its keys could span slots."""
    if not isinstance(bucket, str) or not bucket:
        raise ConfigurationError(f"bucket name must be a non-empty string, got {bucket!r}")
    return bucket


def born_key(prefix: str) -> str:
    """The store's birth marker (µs), set when a script making a state finds it missing; it
    belongs to no bucket, so scripts on a Redis Cluster (one hash slot each) never use it.
    Its tag ``{~born}`` keeps it inside the ``<prefix>{*`` key pattern of an ACL user."""
    return f"{prefix}{{~born}}"


def settle_key(prefix: str) -> str:
    """The end (µs) of the done marks' settle window after the store lost its state
    (``schedule.places.marks_settle_until_us``); like the birth marker, no bucket's."""
    return f"{prefix}{{~settle}}"


def _head(prefix: str, bucket: str, outer: str | None) -> str:
    """The keys' common start: the bucket's hash tag, or a nested bucket's outer's tag first
    (``prefix{outer}{bucket}``: Redis hashes the first tag, so both share one hash slot)."""
    return f"{prefix}{{{bucket}}}" if outer is None else f"{prefix}{{{outer}}}{{{bucket}}}"


def state_key(prefix: str, bucket: str, outer: str | None = None) -> str:
    """The hash holding the bucket's ``BucketState`` (``outer``: the bucket is nested in it)."""
    return f"{_head(prefix, bucket, outer)}:s"


def fair_key(prefix: str, outer: str) -> str:
    """The hash holding an outer bucket's fair share (``schedule.fair``; fair.lua)."""
    return f"{_head(prefix, outer, None)}:f"


def mark_key(prefix: str, bucket: str, task_id: str, retries: int, outer: str | None = None) -> str:
    """The string holding the lease or done mark of one (task_id, retries) in ``bucket``."""
    return f"{_head(prefix, bucket, outer)}:m:{task_id}:{retries}"


def places_key(prefix: str, bucket: str, outer: str | None = None) -> str:
    """The sorted set of a capped bucket's running bodies (``schedule.Place``)."""
    return f"{_head(prefix, bucket, outer)}:r"


def ledger_key(prefix: str, bucket: str, outer: str | None = None) -> str:
    """The capped Stream the scripts append the bucket's ledger to (reserved)."""
    return f"{_head(prefix, bucket, outer)}:l"


def task_keys(
    prefix: str, bucket: str, task_id: str, retries: int, outer: str | None = None
) -> list[str]:
    """``state_key``, ``mark_key``, ``ledger_key`` and ``places_key`` of one copy, built at once
    (the scripts' KEYS of a grant, claim or take)."""
    tag = f"{_head(prefix, validate_bucket(bucket), outer)}:"
    return [f"{tag}s", f"{tag}m:{task_id}:{retries}", f"{tag}l", f"{tag}r"]


def _pattern(prefix: str, kind: str, match: str) -> str:
    """A SCAN ``MATCH`` pattern for the ``kind`` keys under ``prefix`` (its glob characters
    escaped) of the buckets whose names match the Redis glob ``match``."""
    escaped = "".join("\\" + c if c in "*?[]\\" else c for c in prefix)
    return f"{escaped}{{{match}}}:{kind}"


def _bucket_of(prefix: str, key: str | bytes, kind: str) -> str | None:
    text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
    head, tail = f"{prefix}{{", f"}}:{kind}"
    if not text.startswith(head) or not text.endswith(tail) or len(text) <= len(head + tail):
        return None
    bucket = text[len(head) : -len(tail)]
    return bucket.split("}{", 1)[1] if "}{" in bucket else bucket  # a nested bucket's


def ledger_key_pattern(prefix: str) -> str:
    """A SCAN ``MATCH`` pattern for every ledger key under ``prefix`` (glob characters escaped)."""
    return _pattern(prefix, "l", "*")


def bucket_of_ledger_key(prefix: str, key: str | bytes) -> str | None:
    """The bucket whose ledger ``key`` is (the inverse of ``ledger_key``), else None."""
    return _bucket_of(prefix, key, "l")


def state_key_pattern(prefix: str, match: str = "*", *, nested: bool = False) -> str:
    """A SCAN ``MATCH`` pattern for the state hashes of the buckets matching ``match``
    (``nested``: of the nested buckets matching it, whatever their outer)."""
    return _pattern(prefix, "s", f"*}}{{{match}" if nested else match)


def bucket_of_state_key(prefix: str, key: str | bytes) -> str | None:
    """The bucket whose state hash ``key`` is (the inverse of ``state_key``), else None."""
    return _bucket_of(prefix, key, "s")
