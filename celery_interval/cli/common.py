"""What the command lines share: the app of ``celery -A proj``, and errors as one line."""

from __future__ import annotations

from typing import Any

import click

from celery_interval.errors import IntervalError

__all__ = ["app_of", "fail_on_interval_errors"]


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
