"""Bucket declarations in ``interval_queues``: their forms, their checks, and the one lookup
that finds a bucket's field (its own entry, else its ``'queue:*'`` entry, else its queue's)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from celery_interval.buckets import queue_of
from celery_interval.config.intervals import parse_interval_us
from celery_interval.config.suggest import closest, did_you_mean
from celery_interval.config.table import FIELDS
from celery_interval.config.values import check_int, check_share, parse_limits
from celery_interval.errors import ConfigurationError, short_repr
from celery_interval.schedule import Limits

__all__ = [
    "Bucket",
    "Declaration",
    "lookup",
    "lookup_names",
    "parse_declaration",
    "parse_own",
    "parse_queues",
    "weight_of",
]

#: The fields a declaration may name.
FIELD_NAMES = tuple(field.name for field in FIELDS)
_QUEUES_SHAPE = (
    "expected a mapping of queue, 'queue:*' or 'queue:key' to an interval or a declaration, "
    "e.g. {'api': {'interval': '10/s', 'burst': 5}}"
)
_V = TypeVar("_V")


@dataclass(frozen=True)
class Bucket:
    """A bucket's declaration in ``interval_queues`` (or a task's ``interval`` option), the
    typed form of its mapping: each field as the mapping would give it; None: not declared
    here (looked up further: the ``'queue:*'`` entry, then the queue's)."""

    #: Seconds between starts or a rate ("10/s"); required on a queue's entry.
    interval: float | str | None = None
    #: Units that may start back to back after an idle spell (an integer >= 1).
    burst: int | None = None
    #: Extra limits: rates ("100/min") or pairs (rate, burst).
    limits: Sequence[float | str | tuple[float | str, int]] | None = None
    #: The most bodies of the bucket running at once across all workers.
    concurrency: int | None = None
    #: True (at most 100 times the interval) or the slowest interval it may adapt to.
    adaptive: bool | float | str | None = None
    #: The outer bucket whose budget every start also spends.
    outer: str | None = None
    #: The share of the rate kept for ``slot()`` callers, a fraction in (0, 1).
    interactive_share: float | None = None
    #: An outer bucket's starts divided among its nested buckets that wait, by weight.
    fair: bool | None = None
    #: A nested bucket's weight in its fair outer's share (an integer >= 1, default 1), or a
    #: callable of the bucket's name returning one.
    weight: int | Callable[[str], int] | None = None


@dataclass(frozen=True)
class Declaration:
    """A declaration checked, durations in µs; None: not declared here."""

    interval_us: int | None = None
    burst: int | None = None
    limits: Limits | None = None
    concurrency: int | None = None
    #: True: the default slowest interval; an integer: the slowest, µs; False: not adaptive.
    adaptive: bool | int | None = None
    outer: str | None = None
    interactive_share: float | None = None
    fair: bool | None = None
    weight: int | Callable[[str], int] | None = None


def parse_declaration(value: Any, said: str) -> Declaration:
    """An interval (the shorthand) or a declaration (a mapping or ``Bucket``) checked; errors
    name ``said``, the field and the value, and an unknown field the closest known one."""
    if isinstance(value, Bucket):
        given = {f.name: getattr(value, f.name) for f in fields(Bucket)}
    elif isinstance(value, Mapping):
        given = dict(value)
        for name in given:
            if name not in FIELD_NAMES:
                hint = did_you_mean(name, FIELD_NAMES) if isinstance(name, str) else ""
                raise ConfigurationError(
                    f"{said}: unknown option {short_repr(name)}"
                    + (hint or f"; the options are {', '.join(FIELD_NAMES)}")
                )
    else:
        return Declaration(interval_us=parse_interval_us(value, name=said))
    given = {name: field for name, field in given.items() if field is not None}
    return Declaration(
        interval_us=_parsed(given, "interval", said, lambda v, n: parse_interval_us(v, name=n)),
        burst=_parsed(given, "burst", said, _units),
        limits=_parsed(given, "limits", said, parse_limits),
        concurrency=_parsed(
            given, "concurrency", said, lambda v, n: check_int(v, n, 1, "bodies at once")
        ),
        adaptive=_parsed(given, "adaptive", said, _adaptive),
        outer=_parsed(given, "outer", said, _bucket_name),
        interactive_share=_parsed(given, "interactive_share", said, check_share),
        fair=_parsed(given, "fair", said, _flag),
        weight=_parsed(given, "weight", said, _weight),
    )


def parse_own(value: Any, said: str) -> Declaration:
    """A task's ``interval`` option: an interval or a declaration, as in ``interval_queues``,
    without the fields that belong to the bucket alone (``outer``, ``interactive_share``,
    ``fair``, ``weight``)."""
    declaration = parse_declaration(value, said)
    for name in ("outer", "interactive_share", "fair", "weight"):
        if getattr(declaration, name) is not None:
            raise ConfigurationError(
                f"{said}: {name!r} is the bucket's, not a task's: declare it in interval_queues"
            )
    return declaration


def _parsed(
    given: Mapping[str, Any], name: str, said: str, parse: Callable[[Any, str], _V]
) -> _V | None:
    return None if name not in given else parse(given[name], f"{said}[{name!r}]")


def _units(value: Any, said: str) -> int:
    return check_int(value, said, 1, "units of one interval's budget")


def _flag(value: Any, said: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{said}={short_repr(value)}: expected True or False")
    return value


def _weight(value: Any, said: str) -> int | Callable[[str], int]:
    if callable(value):
        return value  # type: ignore[no-any-return]
    return check_int(value, said, 1, "the bucket's weight in its outer's fair share")


def weight_of(declaration: Declaration, bucket: str, said: str) -> int | None:
    """The weight ``declaration`` gives ``bucket`` (a callable's called with its name,
    its answer checked); None: none declared there."""
    weight = declaration.weight
    if weight is None or isinstance(weight, int):
        return weight
    return check_int(weight(bucket), f"{said}({bucket!r})", 1, "a fair share's weight")


def _adaptive(value: Any, said: str) -> bool | int:
    if isinstance(value, bool):
        return value
    try:
        return parse_interval_us(value, name=said)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{exc} (or True: at most 100 times the interval)") from None


def _bucket_name(value: Any, said: str) -> str:
    if not isinstance(value, str) or not value or "*" in value:
        raise ConfigurationError(f"{said}={short_repr(value)}: expected a bucket name")
    return value


def parse_queues(value: Any) -> dict[str, Declaration]:
    """``interval_queues``: each key a queue, ``'queue:*'`` or ``'queue:key'``, each value an
    interval or a declaration; a queue's entry has an interval, a tenant entry's queue is
    declared, an outer bucket's queue is declared and is not nested itself."""
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"interval_queues={short_repr(value)}: {_QUEUES_SHAPE}")
    out: dict[str, Declaration] = {}
    for key, entry in value.items():
        said = f"interval_queues[{key!r}]"
        if not isinstance(key, str) or not key or "*" in key.removesuffix(":*"):
            raise ConfigurationError(
                f"interval_queues key {short_repr(key)}: expected a queue, 'queue:*' or 'queue:key'"
            )
        if "{" in key or "}" in key:
            raise ConfigurationError(
                f"interval_queues key {key!r}: a brace in a bucket name is refused (a nested "
                "bucket's store keys are hash-tagged by its outer bucket's name)"
            )
        declaration = parse_declaration(entry, said)
        if ":" not in key and declaration.interval_us is None:
            raise ConfigurationError(
                f"{said}={short_repr(entry)}: a queue's declaration needs an 'interval', "
                "e.g. {'interval': '10/s'}"
            )
        out[key] = declaration
    queues = sorted(key for key in out if ":" not in key)
    for key, declaration in out.items():
        _check_nesting(out, key, declaration, queues)
    return out


def _check_nesting(
    declared: Mapping[str, Declaration], key: str, declaration: Declaration, queues: list[str]
) -> None:
    """A tenant key's queue is declared; so is its outer bucket's, which is not nested."""
    said = f"interval_queues[{key!r}]"
    queue = queue_of(key)
    if queue not in declared:
        near = closest(queue, queues)
        shown = "" if near is None else f"; did you mean {near + key[len(queue) :]!r}?"
        raise ConfigurationError(f"{said}: no queue {queue!r} is declared{shown}")
    if declaration.fair and not any(d.outer == key for d in declared.values()):
        raise ConfigurationError(
            f"{said}['fair']=True: no bucket is nested in {key!r}; declare its keys' "
            f"'outer', e.g. {{'{queue}:*': {{'outer': {key!r}}}}}"
        )
    outer = lookup(declared, key, lambda d: d.outer, to_queue=False)
    if declaration.weight is not None and (
        outer is None or not lookup(declared, outer, lambda d: d.fair, to_queue=False)
    ):
        where = "it is not nested" if outer is None else f"its outer {outer!r} is not fair"
        raise ConfigurationError(
            f"{said}['weight']: a weight is a nested bucket's share of a fair outer bucket, "
            f"and {where} (declare 'outer', and 'fair': True on the outer)"
        )
    outer = declaration.outer
    if outer is None:
        return
    said = f"{said}['outer']={outer!r}"
    if "{" in outer or "}" in outer:
        raise ConfigurationError(
            f"{said}: a brace in a bucket name is refused (a nested bucket's store keys are "
            "hash-tagged by its outer bucket's name)"
        )
    if queue_of(outer) not in declared:
        raise ConfigurationError(
            f"{said}: no queue {queue_of(outer)!r} is declared"
            + did_you_mean(queue_of(outer), queues)
        )
    if outer == key:
        raise ConfigurationError(f"{said}: a bucket is not nested in itself")
    nested = lookup(declared, outer, lambda d: d.outer, to_queue=False)
    if nested is not None and nested != outer:
        raise ConfigurationError(
            f"{said}: {outer!r} is nested itself (in {nested!r}); one level of nesting only"
        )


def lookup_names(bucket: str, *, to_queue: bool = True) -> tuple[str, ...]:
    """Where a field of ``bucket`` is looked for, first to last: its own entry, then for a
    ``queue:key`` bucket its ``'queue:*'`` entry and (``to_queue``) its queue's."""
    queue = queue_of(bucket)
    if queue == bucket:
        return (bucket,)
    return (bucket, f"{queue}:*", queue) if to_queue else (bucket, f"{queue}:*")


def lookup(
    declared: Mapping[str, Declaration],
    bucket: str,
    read: Callable[[Declaration], _V | None],
    *,
    to_queue: bool = True,
) -> _V | None:
    """The first field ``read`` finds declared for ``bucket`` (``lookup_names`` order); None:
    none of its entries declares it."""
    for name in lookup_names(bucket, to_queue=to_queue):
        entry = declared.get(name)
        if entry is not None:
            value = read(entry)
            if value is not None:
                return value
    return None
