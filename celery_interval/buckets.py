"""Bucket names: what makes one valid, the queue a bucket falls back to, its overflow queue."""

from __future__ import annotations

import hashlib

from celery_interval.errors import ConfigurationError, short_repr

__all__ = [
    "MAX_BUCKET_CHARS",
    "check_bucket",
    "is_bucket_name",
    "overflow_queue_name",
    "queue_of",
]

#: A bucket name is part of every store key of the bucket: longer ones are refused.
MAX_BUCKET_CHARS = 200
#: The longest overflow queue name (AMQP allows 255 bytes).
MAX_OVERFLOW_NAME_BYTES = 200


def is_bucket_name(bucket: object) -> bool:
    """Whether ``bucket`` can name a bucket: a non-empty string of at most MAX_BUCKET_CHARS."""
    return isinstance(bucket, str) and 0 < len(bucket) <= MAX_BUCKET_CHARS


def check_bucket(bucket: object, what: str) -> str:
    """``bucket`` if it can name a bucket; else ``ConfigurationError`` quoting ``what``."""
    if not isinstance(bucket, str) or not bucket:
        raise ConfigurationError(f"{what}{short_repr(bucket)}: expected a non-empty string")
    if len(bucket) > MAX_BUCKET_CHARS:
        raise ConfigurationError(
            f"{what}{short_repr(bucket)}: a bucket name is at most {MAX_BUCKET_CHARS} characters"
        )
    return bucket


def queue_of(bucket: str) -> str:
    """The queue whose interval a ``queue:key`` bucket falls back to (``queue`` itself)."""
    return bucket.split(":", 1)[0]


def overflow_queue_name(queue: str, bucket: str) -> str:
    """The broker queue where ``bucket``'s tasks from ``queue`` wait: readable, and unique."""
    own = queue_of(bucket) == queue
    name = f"ci-overflow:{bucket}" if own else f"ci-overflow:{queue}:{bucket}"
    if len(name.encode()) <= MAX_OVERFLOW_NAME_BYTES:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:16]
    return name.encode()[: MAX_OVERFLOW_NAME_BYTES - 17].decode(errors="ignore") + "~" + digest
