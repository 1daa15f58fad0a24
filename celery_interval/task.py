"""IntervalTask: the base class that routes a task's starts through its bucket's slots."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery import Task

from celery_interval.errors import ConfigurationError
from celery_interval.intervals import parse_interval_us

__all__ = ["BUCKET_HEADER", "START_HEADER", "IntervalTask", "bucket_of", "interval_of"]

BUCKET_HEADER = "interval_bucket"
START_HEADER = "interval_start_ns"
SPIN_HEADER = "interval_spin_ns"
CLAIMED_HEADER = "interval_claimed_ns"
TICKET_HEADER = "interval_ticket"

BucketSpec = str | Callable[[Sequence[Any], Mapping[str, Any]], object] | None


class IntervalTask(Task):  # type: ignore[misc]
    """A task whose starts are spaced by its bucket's interval across the whole pool."""

    Strategy = "celery_interval.worker.strategy:interval_strategy"
    #: Seconds or a rate ("10/s"); default: the bucket's entry in ``interval_queues``.
    interval: float | str | None = None
    #: A bucket name, or a callable of (args, kwargs) giving a key inside the queue's bucket.
    interval_bucket: BucketSpec = None

    @classmethod
    def on_bound(cls, app: Any) -> None:
        from celery_interval.install import install

        install(app)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        interval_bucket: str | None = None,
        **options: Any,
    ) -> Any:
        """Send as usual; ``interval_bucket=`` overrides the bucket of this one call."""
        if interval_bucket is not None:
            if not isinstance(interval_bucket, str) or not interval_bucket:
                raise ConfigurationError(
                    f"interval_bucket={interval_bucket!r}: expected a non-empty string"
                )
            options["headers"] = {**(options.get("headers") or {}), BUCKET_HEADER: interval_bucket}
        return super().apply_async(args, kwargs, **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start_ns = self.request.get(START_HEADER)
        if isinstance(start_ns, int):
            wait_until(start_ns, int(self.request.get(SPIN_HEADER) or 0))
        return super().__call__(*args, **kwargs)


def wait_until(deadline_ns: int, spin_ns: int) -> None:
    """Sleep until ``spin_ns`` before a monotonic deadline, then spin: waking from sleep can
    be milliseconds late on a VM whose idle vCPU was halted; a running process is on time."""
    sleep_ns = deadline_ns - spin_ns - time.monotonic_ns()
    if sleep_ns > 0:
        time.sleep(sleep_ns / 1e9)
    while time.monotonic_ns() < deadline_ns:
        pass


def bucket_of(
    task: Any,
    headers: Mapping[str, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    routing_key: str | None,
) -> str:
    """The bucket of one message: header override, task option, else the task's queue."""
    override = headers.get(BUCKET_HEADER)
    if override is not None:
        if not isinstance(override, str) or not override:
            raise ConfigurationError(
                f"message header {BUCKET_HEADER}={override!r}: expected a non-empty string"
            )
        return override
    base = getattr(task, "queue", None) or routing_key or task.app.conf.task_default_queue
    # Read statically: a function stored on the task class would otherwise bind as a method.
    spec = inspect.getattr_static(task, "interval_bucket", None)
    if isinstance(spec, (staticmethod, classmethod)):
        spec = spec.__get__(None, type(task))
    if spec is None:
        return str(base)
    if isinstance(spec, str):
        return spec
    try:
        key = spec(args, kwargs)
    except Exception as exc:
        raise ConfigurationError(
            f"{task.name}.interval_bucket raised {exc.__class__.__name__}: {exc}"
        ) from exc
    return f"{base}:{key}"


def interval_of(task: Any, bucket: str, configured: Callable[[str], int]) -> int:
    """The task's own ``interval`` option, else the configured interval of its bucket (µs)."""
    own = getattr(task, "interval", None)
    if own is None:
        return configured(bucket)
    return parse_interval_us(own, name=f"{task.name}.interval")
