"""What the command lines share: the app of ``celery -A proj``, errors as one line, options."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from celery_interval.errors import IntervalError

_Command = TypeVar("_Command", bound=Callable[..., Any])

__all__ = [
    "app_of",
    "fail_on_interval_errors",
    "match_option",
    "non_empty_glob",
    "positive_seconds",
    "seconds_option",
]


def app_of(ctx: click.Context) -> Any:
    """The Celery app of ``celery -A proj interval …``."""
    obj = ctx.find_root().obj
    app = getattr(obj, "app", None)
    if app is None:
        raise click.UsageError("no app: run it as `celery -A proj interval …`")
    return app


def fail_on_interval_errors(fn: Any) -> Any:
    """A command whose ``IntervalError`` becomes a one-line click error."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except IntervalError as exc:
            raise click.ClickException(str(exc)) from exc

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def positive_seconds(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """A click callback: ``value`` if it is a number of seconds above 0."""
    if not value > 0 or value == float("inf"):
        raise click.BadParameter(f"{value!r}: expected seconds > 0")
    return value


def non_empty_glob(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A click callback: ``value`` if it is a non-empty glob."""
    if not value:
        raise click.BadParameter(f"{value!r}: expected a glob such as 'api:*'")
    return value


def seconds_option(
    flag: str, dest: str, default: float, help: str
) -> Callable[[_Command], _Command]:
    """An option of seconds above 0, checked."""
    return click.option(
        flag,
        dest,
        default=default,
        show_default=True,
        type=float,
        callback=positive_seconds,
        help=help,
    )


#: ``--match GLOB``: only the buckets whose names match.
match_option = click.option(
    "--match",
    default="*",
    show_default=True,
    metavar="GLOB",
    callback=non_empty_glob,
    help="Only buckets whose names match, e.g. 'api:*'.",
)
