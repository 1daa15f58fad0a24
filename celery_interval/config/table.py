"""Every default, once: the ``interval_*`` settings table (key, default, meaning), the settings
that moved into bucket declarations, and the defaults of the stores' own constructors."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "DEFAULTS",
    "FIELDS",
    "HEALTH_CHECK_INTERVAL_S",
    "KEY_PREFIX",
    "LEDGER_MAX",
    "MOVED",
    "SETTINGS",
    "STORE_TIMEOUT_S",
    "Field",
    "Setting",
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
        "Bucket → its declaration. A key is a queue, ``'queue:*'`` (each ``queue:key`` tenant "
        "bucket of that queue) or one ``queue:key`` bucket. A value is an interval: seconds "
        "between starts (``0.5``, ``'500ms'``, ``'2s'``) or a rate of starts (``'10/s'``, "
        "``'30/m'``, ``'100/h'``), above 0, at most one day; or a declaration, a mapping or "
        "``celery_interval.Bucket`` with ``interval`` (required on a queue), ``burst``, "
        "``limits``, ``concurrency``, ``adaptive``, ``outer``, ``interactive_share``, ``fair`` "
        "and ``weight`` (see the bucket declaration). A ``queue:key`` bucket takes each field "
        "from its own entry, else ``'queue:*'``, else its queue's (``outer``, ``fair`` and "
        "``weight``: not from its queue's).",
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
        "(capped at 0.02 s and one interval, a nested bucket's outer's if longer) after its "
        "claim: time for the reply and to reach a pool process.",
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


class Field(NamedTuple):
    """One field of a bucket's declaration in ``interval_queues``: its name, an example
    declaration using it and what it means (for the reference)."""

    name: str
    example: str
    meaning: str


FIELDS: tuple[Field, ...] = (
    Field(
        "interval",
        "{'api': {'interval': '10/s'}}",
        "Seconds between starts (``0.5``, ``'500ms'``, ``'2s'``) or a rate of starts "
        "(``'10/s'``, ``'30/m'``, ``'100/h'``); above 0, at most one day. Required on a queue's "
        "entry; a ``'queue:*'`` or ``queue:key`` entry without one takes its queue's.",
    ),
    Field(
        "burst",
        "{'api': {'interval': '10/s', 'burst': 5}}",
        "An integer >= 1 (default 1): after an idle spell this many units start back to back, "
        "then one per interval (the budget refills one unit per interval); in every window of "
        "starts Σ cost <= burst + span / interval. A task costs 1 unit, or its "
        "``interval_cost`` (an option, or ``apply_async(interval_cost=…)``; more than the burst "
        "is an error at send time).",
    ),
    Field(
        "limits",
        "{'api': {'interval': '10/s', 'limits': ['100/min', ('1000/h', 50)]}}",
        "Extra limits beside the interval, a list of rates (``'100/min'``) or pairs (rate, "
        "burst) (``('1000/h', 50)``; a burst is an integer >= 1, default 1): every start "
        "conforms to each of them at once, in one atomic step on the bucket's record. With "
        "burst B a rate N/unit never has more than N + B - 1 cost units start in any window of "
        "length unit. A task's cost may not exceed any limit's burst.",
    ),
    Field(
        "concurrency",
        "{'api': {'interval': '10/s', 'concurrency': 4}}",
        "The most task bodies of the bucket that run at once across every worker (an integer "
        ">= 1); each ``queue:key`` bucket has its own places. A start needs its slot and a free "
        "place; a body holds its place until it ends, renewed while it runs; a dead worker's "
        "places come back after ``interval_lease_s``.",
    ),
    Field(
        "adaptive",
        "{'api': {'interval': '10/s', 'adaptive': '1/m'}}",
        "``True`` or the slowest interval (``'1/m'``, ``60``): the bucket lengthens its "
        "interval when a task raises ``Throttled`` (by half when throttled again within 20 "
        "starts, else by a ninth) and eases back to the declared one by 1/2000 of its rate per "
        "clean start. ``True``: at most 100 times the declared interval (one day at most).",
    ),
    Field(
        "outer",
        "{'api': '10/s', 'api:*': {'interval': '1/s', 'outer': 'api'}}",
        "The outer bucket (a declared queue, or one of its ``queue:key`` buckets) whose budget "
        "(interval, burst, limits) every start of this bucket also spends: each tenant keeps "
        "its own limits and all of them together keep the outer's, in one atomic step on both "
        "records. One level. Taken from the bucket's own entry or its ``'queue:*'`` entry only, "
        "never from its queue's. A nested bucket's store keys carry its outer's hash tag (one "
        "Redis Cluster slot).",
    ),
    Field(
        "interactive_share",
        "{'api': {'interval': '10/s', 'interactive_share': 0.2}}",
        "The share of the bucket's rate kept for ``slot()`` callers, a fraction above 0 and "
        "below 1: an inline start goes ahead of the bucket's granted tickets, to the next start "
        "its budget allows, and such starts are held to that share of the rate (one per "
        "``interval / share``); the tickets it passes start one interval later each, in order. "
        "Unused, the share is the tasks'. A nested bucket (``outer``) has none.",
    ),
    Field(
        "fair",
        "{'api': {'interval': '50/s', 'fair': True}, 'api:*': {'outer': 'api'}}",
        "On an outer bucket: its starts are divided among the buckets nested in it that have "
        "work waiting, in proportion to their ``weight`` (max-min fair: a bucket its own limits "
        "hold below its share gets all they allow, the rest is shared by the others; while any "
        "has work the outer's limit is used in full). Decided in the store, across workers. "
        "Without it the outer's starts go to whichever claim fits first.",
    ),
    Field(
        "weight",
        "{'api:*': {'outer': 'api', 'weight': 1}, 'api:gold': {'weight': 3}}",
        "A nested bucket's weight in its fair outer's share: an integer >= 1 (default 1), or a "
        "callable given the bucket's name that returns one (a tenant's plan, looked up when "
        "its tasks claim). Taken from the bucket's own entry or its ``'queue:*'`` entry.",
    ),
)

#: Every setting's default.
DEFAULTS: dict[str, Any] = {setting.key: setting.default for setting in SETTINGS}

#: Settings that are now fields of a bucket's declaration in ``interval_queues``: the old
#: key → the field and an example value of it.
MOVED: dict[str, tuple[str, str]] = {
    "interval_burst": ("burst", "5"),
    "interval_limits": ("limits", "['100/min', ('1000/h', 50)]"),
    "interval_concurrency": ("concurrency", "4"),
    "interval_adaptive": ("adaptive", "True"),
    "interval_outer": ("outer", "'api'"),
    "interval_interactive_share": ("interactive_share", "0.2"),
}
