"""A task's cost in its bucket's budget (``interval_cost``): chosen at send, read by the worker."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery_interval.config import check_int, settings_of
from celery_interval.errors import ConfigurationError
from celery_interval.headers import COST_HEADER
from celery_interval.placement import Arrival, bucket_of, call_option, own_of
from celery_interval.schedule import Limits
from celery_interval.schedule.outer import Outer

__all__ = ["CostSpec", "check_cost_option", "check_within_burst", "message_cost", "send_cost"]

#: A cost: units (an integer, or a number rounded up), or a callable of (args, kwargs) giving it.
CostSpec = int | float | Callable[[Sequence[Any], Mapping[str, Any]], object] | None


def units(value: Any, name: str) -> int:
    """A cost as whole units: an integer >= 1, or a finite number > 0 rounded up."""
    if isinstance(value, float) and math.isfinite(value) and value > 0:
        return math.ceil(value)
    return check_int(value, name, 1, "units of one interval's budget")


def _option(task: Any) -> CostSpec:
    """The task's ``interval_cost`` option, read statically (a function stored on the task
    class would otherwise bind as a method)."""
    getter = getattr(task, "_get_current_object", None)  # a task not yet bound: its proxy
    spec = inspect.getattr_static(task if getter is None else getter(), "interval_cost", None)
    if isinstance(spec, (staticmethod, classmethod)):
        spec = spec.__get__(None, type(task))
    return spec  # type: ignore[no-any-return]


def check_cost_option(task: Any, name: str) -> None:
    """A task class's ``interval_cost``: a number of units, a callable or None."""
    spec = _option(task)
    if spec is not None and not callable(spec):
        units(spec, f"{name}.interval_cost")


def _resolve(task: Any, spec: CostSpec, arrival: Arrival) -> int:
    name = f"{task.name}.interval_cost"
    if callable(spec):
        return units(call_option(name, spec, arrival), f"{name}(args, kwargs)")
    return units(spec, name)


def check_within_burst(
    task_name: str,
    bucket: str,
    cost: int,
    burst: int,
    limits: Limits = (),
    outer: Outer | None = None,
) -> None:
    """A start costs at most its bucket's burst, and at most each extra limit's (and, in a
    nested bucket, its ``outer`` bucket's): a larger one could never fit the budget."""
    if outer is not None:
        check_within_burst(task_name, outer.bucket, cost, outer.burst, outer.limits)
    if cost > burst:
        raise ConfigurationError(
            f"task {task_name}: interval_cost={cost} is more than the burst of bucket "
            f"{bucket!r} ({burst}; declare its burst as at least {cost} in interval_queues)"
        )
    for i, limit in enumerate(limits):
        if cost > limit.burst:
            raise ConfigurationError(
                f"task {task_name}: interval_cost={cost} is more than the burst of bucket "
                f"{bucket!r}'s limit {i} ({limit.burst}; give limit {i} of its declaration in "
                f"interval_queues a burst of at least {cost})"
            )


def send_cost(
    task: Any, per_call: Any, sent: Arrival, queue: Callable[[], str | None]
) -> int | None:
    """The cost to stamp on a message being sent (None: the task has none): ``per_call``
    (``apply_async(interval_cost=…)``), else the cost the headers already carry (a retry's),
    else the task's option; checked against the burst of the bucket it is sent to (``sent``
    with ``queue()``, the queue it goes to, asked only then)."""
    if per_call is None and sent.headers.get(COST_HEADER) is not None:
        return None  # a copy of the message's own cost
    spec = per_call if per_call is not None else _option(task)
    if spec is None:
        return None
    cost = _resolve(task, spec, sent) if per_call is None else units(per_call, "interval_cost")
    bucket = bucket_of(sent._replace(queue=queue()))
    settings, own = settings_of(task.app), own_of(task)
    check_within_burst(
        task.name,
        bucket,
        cost,
        settings.burst_of(bucket, own),
        settings.limits_of(bucket, own),
        settings.outer_of(bucket),
    )
    return cost


def message_cost(arrival: Arrival) -> int:
    """The cost of a received message: its header (set at send), else the task's option, else 1."""
    header = arrival.headers.get(COST_HEADER)
    if header is not None:
        return units(header, f"message header {COST_HEADER}")
    spec = _option(arrival.task)
    return 1 if spec is None else _resolve(arrival.task, spec, arrival)
