"""One exception hierarchy for everything celery_interval raises."""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "IntervalError",
    "StoreError",
    "StoreRefused",
    "StoreUnavailable",
    "TransientError",
    "UnknownBucket",
    "short_repr",
]


def short_repr(value: object) -> str:
    """``repr(value)``, cut short: a message quoting a 10 KB header helps nobody."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}… ({len(text)} characters)"


class IntervalError(Exception):
    """Base class of every error this package raises."""


class ConfigurationError(IntervalError, ValueError):
    """A setting, interval, rate or URL is invalid; the message names it."""


class UnknownBucket(ConfigurationError):
    """A control command named a bucket that is not configured."""


class StoreError(IntervalError):
    """The shared store answered with something the model does not allow."""


class StoreUnavailable(StoreError):
    """The shared store could not be reached; nothing was changed or it is unknown whether."""


class StoreRefused(StoreUnavailable):
    """The store answered with an error that passes by itself or by an operator's hand (out of
    memory, a failed disk save, a replica, loading, a busy script, no permission): it ran
    nothing of the call, which is retried like an outage (``stores.redis_client``)."""


class TransientError(IntervalError):
    """A task's ``interval_bucket`` or ``interval_cost`` callable raised an error that may pass
    (not one of a bug's: ``placement.BUG_ERRORS``); the worker tries the message again."""
