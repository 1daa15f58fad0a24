"""Every default, once: the ``interval_*`` settings table (key, default, meaning) and the
defaults of the stores' own constructors; ``config`` validates against it, the docs render it."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "HEALTH_CHECK_INTERVAL_S",
    "KEY_PREFIX",
    "LEDGER_MAX",
    "SETTINGS",
    "STORE_TIMEOUT_S",
    "Setting",
    "default_of",
]

#: Prefix of every store key (``interval_key_prefix``).
KEY_PREFIX = "ci:"
#: Ledger entries kept per bucket (``interval_ledger_max``).
LEDGER_MAX = 100_000
#: Socket timeout of store calls, seconds (``interval_store_timeout_s``).
STORE_TIMEOUT_S = 2.0
#: How often redis-py checks an idle connection before using it, seconds.
HEALTH_CHECK_INTERVAL_S = 30


class Setting(NamedTuple):
    """One ``app.conf`` setting: its key, its default and what it means (for the reference)."""

    key: str
    default: Any
    meaning: str
    #: How the default reads in the reference, where ``repr(default)`` would not say it.
    shown: str = ""


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "interval_queues",
        {},
        "Bucket (queue) → interval: seconds between starts (``0.5``, ``'500ms'``, ``'2s'``) "
        "or a rate of starts (``'10/s'``, ``'30/m'``, ``'100/h'``); above 0, at most one day.",
    ),
    Setting(
        "interval_adaptive",
        {},
        "Bucket (queue) → ``True`` or the slowest interval (``'1/m'``, ``60``): an adaptive "
        "bucket lengthens its interval when a task raises ``Throttled`` (by half when throttled "
        "again within 20 starts, else by a ninth) and eases back to the configured one by "
        "1/2000 of its rate per clean start. ``True``: at most 100 times the configured "
        "interval (one day at most).",
    ),
    Setting(
        "interval_concurrency",
        {},
        "Bucket (queue) → the most task bodies of it that run at once across every worker "
        "(an integer >= 1); ``queue:key`` buckets take their queue's entry, each tenant its own "
        "places. A start needs its slot and a free place; a body holds its place until it ends, "
        "renewed while it runs; a dead worker's places come back after ``interval_lease_s``. "
        "A task's ``interval_concurrency`` option wins.",
    ),
    Setting(
        "interval_burst",
        {},
        "Bucket (queue) → its burst, an integer >= 1: after an idle spell this many units "
        "start back to back, then one per interval (the budget refills one unit per interval); "
        "in every window of starts Σ cost <= burst + span / interval. A task costs 1 unit, or "
        "its ``interval_cost`` (an option, or ``apply_async(interval_cost=…)``; more than the "
        "burst is an error at send time). ``queue:key`` buckets take their queue's entry.",
    ),
    Setting(
        "interval_limits",
        {},
        "Bucket (queue) → its extra limits beside its interval, a list of rates (``'100/min'``) "
        "or pairs (rate, burst) (``('1000/h', 50)``; a burst is an integer >= 1, default 1): "
        "every start conforms to each of them at once, in one atomic step on the bucket's "
        "record. With burst B a rate N/unit never has more than N + B - 1 cost units start in "
        "any window of length unit (N with B = 1). A task's cost may not exceed any limit's "
        "burst. ``queue:key`` buckets take their queue's entry unless they have their own.",
    ),
    Setting(
        "interval_outer",
        {},
        "Inner bucket, or ``'queue:*'`` for all of a queue's ``queue:key`` tenant buckets → "
        "the outer bucket whose budget (interval, ``interval_burst``, ``interval_limits``) "
        "every start of the inner bucket also spends, e.g. ``{'api:*': 'api'}``: each tenant "
        "keeps its own limits and all of them together keep the outer's, in one atomic step on "
        "both records. One level; the outer bucket's queue must be in ``interval_queues``. A "
        "nested bucket's store keys carry its outer's hash tag (one Redis Cluster slot).",
    ),
    Setting(
        "interval_interactive_share",
        {},
        "Bucket (queue) → the share of its rate kept for ``slot()`` callers, a fraction above 0 "
        "and below 1 (``0.2``): an inline start goes ahead of the bucket's granted tickets, to "
        "the next start its budget allows, and such starts are held to that share of the rate "
        "(one per ``interval / share``); the tickets it passes start one interval later each, in "
        "order. Unused, the share is the tasks'. ``queue:key`` buckets take their queue's entry; "
        "a bucket nested in an outer bucket (``interval_outer``) has none.",
    ),
    Setting(
        "interval_store_url",
        None,
        "Where the shared state lives: ``redis://``, ``rediss://``, ``unix:///path.sock``, "
        "``redis+cluster://h1:7000,h2:7000`` (``rediss+cluster://``), "
        "``redis+sentinel://h1:26379,h2:26379/mymaster`` (``rediss+sentinel://``), "
        "``file:///shared/dir`` or ``memory://``.",
        shown="the broker, if Redis",
    ),
    Setting(
        "interval_key_prefix",
        KEY_PREFIX,
        "Prefix of every store key; apps sharing a Redis need different ones.",
    ),
    Setting(
        "interval_hold_ahead_s",
        2.0,
        "A worker holds about this long of a bucket's pace (at least one task); the rest park "
        "in the bucket's overflow queue.",
    ),
    Setting(
        "interval_max_held_total",
        4000,
        "Tasks a worker holds over all buckets; past it every arrival parks.",
    ),
    Setting(
        "interval_max_held",
        400,
        "Most tasks a worker holds per bucket (without parking: it stops fetching the queue).",
    ),
    Setting(
        "interval_max_ahead_s",
        300.0,
        "Without parking: a worker stops fetching when its latest held slot is this far away.",
    ),
    Setting(
        "interval_overflow",
        True,
        "Park what a worker cannot hold; ``False`` stops fetching instead (parking needs a "
        "Redis or memory store).",
    ),
    Setting(
        "interval_lead_s",
        0.012,
        "A claim may come this early; the pool process waits for the exact start (at most 0.02).",
    ),
    Setting(
        "interval_handoff_s",
        0.008,
        "A start is never sooner than this plus half the worker's best round trip to the store "
        "(capped at 0.02 s and one interval) after its claim: time for the reply and to reach "
        "a pool process.",
    ),
    Setting(
        "interval_ledger_max",
        LEDGER_MAX,
        "Ledger entries kept per bucket (0 turns the ledger off).",
    ),
    Setting(
        "interval_lease_s",
        30.0,
        "Lease of a claimed task until its ack; renewed while an ``acks_late`` task runs.",
    ),
    Setting(
        "interval_dedupe_ttl_s",
        7200.0,
        "How long an acknowledged ``(task_id, retries)`` is remembered.",
    ),
    Setting(
        "interval_store_timeout_s",
        STORE_TIMEOUT_S,
        "Socket timeout of store calls.",
    ),
    Setting(
        "interval_pause_poll_s",
        5.0,
        "While holding paused tasks, how often to re-check the store (broadcasts act at once).",
    ),
    Setting(
        "interval_retry_max_s",
        5.0,
        "Longest backoff between store retries during an outage.",
    ),
    Setting(
        "interval_broker_timeout_s",
        None,
        "The broker's redelivery timeout, for the start-up warning about long holds.",
        shown="from the broker",
    ),
)

_BY_KEY = {setting.key: setting for setting in SETTINGS}


def default_of(key: str) -> Any:
    """The default of setting ``key`` (a ``KeyError`` names an unknown one)."""
    return _BY_KEY[key].default
