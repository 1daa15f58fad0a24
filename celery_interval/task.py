"""IntervalTask: the base class that routes a task's starts through its bucket's slots."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery import Task

from celery_interval.buckets import check_bucket
from celery_interval.config import Bucket, parse_own, settings_of
from celery_interval.config.suggest import did_you_mean
from celery_interval.costs import CostSpec, check_cost_option, send_cost
from celery_interval.errors import ConfigurationError, UnknownBucket, short_repr
from celery_interval.headers import BUCKET_HEADER, COST_HEADER, START_HEADER
from celery_interval.placement import PACED_STRATEGY, Arrival, bucket_of, own_of
from celery_interval.throttled import Throttled
from celery_interval.worker.process import resend, started, throttle

__all__ = ["IntervalTask"]

BucketSpec = str | Callable[[Sequence[Any], Mapping[str, Any]], object] | None


class IntervalTask(Task):  # type: ignore[misc]
    """A task whose starts are spaced by its bucket's interval across the whole pool."""

    Strategy = PACED_STRATEGY
    #: Seconds or a rate ("10/s"), or a declaration (a mapping or ``Bucket``: interval,
    #: burst, limits, concurrency, adaptive) whose fields win over the bucket's in
    #: ``interval_queues`` for this task; default: the bucket's declaration.
    interval: float | str | Mapping[str, Any] | Bucket | None = None
    #: A bucket name, or a callable of (args, kwargs) giving a key inside the queue's bucket.
    interval_bucket: BucketSpec = None
    #: Units of the bucket's budget a start uses (at most its burst): a number, or
    #: a callable of (args, kwargs) giving one (e.g. estimated tokens); default 1.
    interval_cost: CostSpec = None

    @classmethod
    def on_bound(cls, app: Any) -> None:
        from celery_interval.install import install

        install(app)
        _check_options(cls)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        interval_bucket: str | None = None,
        interval_cost: int | float | None = None,
        **options: Any,
    ) -> Any:
        """Send as usual; ``interval_bucket=`` overrides the bucket of this one call,
        ``interval_cost=`` its cost (more than the bucket's burst raises ConfigurationError)."""
        headers = dict(options.get("headers") or {})
        if interval_bucket is not None:
            check_bucket(interval_bucket, "interval_bucket=")
            headers[BUCKET_HEADER] = interval_bucket
        sent = Arrival(self, headers, args or (), kwargs or {}, None)
        queue = _send_queue(self, options, sent)
        _check_declared(self, sent, queue)
        cost = send_cost(self, interval_cost, sent, lambda: queue)
        if cost is not None:
            headers[COST_HEADER] = cost
        if headers:
            options["headers"] = headers
        return super().apply_async(args, kwargs, **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.get(START_HEADER) is not None:
            started.before_body(self.app, request)
        try:
            return super().__call__(*args, **kwargs)
        except Throttled as exc:
            throttle.throttled(self, exc)

    def retry(self, *args: Any, **options: Any) -> Any:
        """Celery's retry, its message published however long the broker is down (unless the
        call gives its own ``retry_policy``): the message being run is already acked, so a
        retry Celery gave up publishing (and rejected) would be lost."""
        request = self.request
        if not request.called_directly and not request.is_eager:
            policy = options.setdefault("retry_policy", resend.until_sent("retry of", request.id))
            options.setdefault("retry", True)
            if self._retry_is_sent(args, options):
                resend.connect_pool(self.app, policy)
        return super().retry(*args, **options)

    def _retry_is_sent(self, args: tuple[Any, ...], options: dict[str, Any]) -> bool:
        """Whether Celery's ``retry`` publishes (``max_retries`` not exceeded, as it decides):
        a task at its last retry fails at once, not after the broker is back."""
        max_retries = args[6] if len(args) > 6 else options.get("max_retries")
        if max_retries is None:
            max_retries = self.max_retries
        return max_retries is None or self.request.retries + 1 <= max_retries

    def on_replace(self, sig: Any) -> Any:
        """Celery's replace, the replacement published however long the broker is down."""
        if not self.request.is_eager:
            policy = resend.until_sent("replacement of", self.request.id)
            sig.set(retry=True, retry_policy=policy)
            resend.connect_pool(self.app, policy)
        return super().on_replace(sig)


def _check_options(cls: type[IntervalTask]) -> None:
    """A task's ``interval`` and ``interval_bucket`` options, checked when it is bound."""
    name = getattr(cls, "name", None) or cls.__name__
    if cls.interval is not None:
        parse_own(cls.interval, f"{name}.interval")
    if getattr(cls, "interval_concurrency", None) is not None:
        raise ConfigurationError(
            f"{name}.interval_concurrency is no longer an option: declare it in the task's "
            "interval, e.g. interval={'concurrency': 2}"
        )
    check_cost_option(cls, name)
    spec = inspect.getattr_static(cls, "interval_bucket", None)
    if isinstance(spec, str):
        check_bucket(spec, f"{name}.interval_bucket=")
    elif spec is not None and not callable(spec) and not isinstance(spec, classmethod):
        raise ConfigurationError(
            f"{name}.interval_bucket={short_repr(spec)}: expected a bucket name or a callable "
            "of (args, kwargs) returning a key"
        )


def _check_declared(task: IntervalTask, sent: Arrival, queue: str | None) -> None:
    """Refuse a send whose bucket has no declared interval (its worker would fail it), naming
    the bucket and the closest declared one; only when the bucket is known here: an
    ``interval_bucket`` given or a static option, else the queue the send goes to."""
    settings = settings_of(task.app)
    own = own_of(task)
    if own is not None and own.interval_us:
        return
    static = inspect.getattr_static(task, "interval_bucket", None)
    named = sent.headers.get(BUCKET_HEADER) is not None or isinstance(static, str)
    if not named and queue is None:
        return
    if not named and static is not None:  # a key inside the queue's bucket: the queue's pace
        bucket = str(queue)
    else:
        bucket = bucket_of(sent._replace(queue=queue))
    if settings.has_interval(bucket):
        return
    raise UnknownBucket(
        f"task {task.name}: bucket {bucket!r} has no interval declared in interval_queues"
        + did_you_mean(bucket, settings.buckets())
    )


def _send_queue(task: IntervalTask, options: Mapping[str, Any], sent: Arrival) -> str | None:
    """The queue a send goes to: ``queue=``, else where the app's routes send it (None: the
    router does not say; ``bucket_of`` then takes the task's own or the default queue)."""
    queue = options.get("queue")
    if queue is None:
        try:
            route = task.app.amqp.router.route(dict(options), task.name, sent.args, sent.kwargs)
            queue = route.get("queue")
        except Exception:  # a router that fails here fails the send itself, with its own error
            return None
    return None if queue is None else str(getattr(queue, "name", queue))
