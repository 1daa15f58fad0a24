"""Table tests of the pure model (``schedule``) with injected times; a property test of P5/P8."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_interval import schedule
from celery_interval.schedule import (
    BucketState,
    Claim,
    ClaimTerms,
    Outcome,
    Pace,
)
from tests.helpers.schedule_checks import check_sequence
from tests.helpers.schedule_model import (
    HOLDERS,
    I_US,
    IDLE_US,
    LOSE,
    ML,
    OLD_BORN_US,
    PAUSE,
    RECORD,
    STARTS,
    STATUS,
    T0_US,
    TASKS,
    UNPAUSE,
    UNSET,
    Model,
    Step,
    at,
    claim,
    done,
    grant,
    renew,
    set_interval,
    throttle,
)

# -- the tables, each run on a Model (tests/helpers/schedule_model.py) --------------------------


def run_table(steps: list[Step], expected: list[Any], born_us: int | None = None) -> None:
    assert Model(born_us=born_us).run(steps) == expected


# -- grant ------------------------------------------------------------------------------------

GRANT_TABLE = [
    (
        "grants are spaced one interval, the first max lead + one interval out (new epoch)",
        [at(0), grant("a"), grant("b"), grant("c"), at(ML + 5_000), grant("d"), grant("e")],
        [("OK", 1, ML + 1_000, ML + 1_000), ("OK", 2, ML + 2_000, ML + 2_000),
         ("OK", 3, ML + 3_000, ML + 3_000), ("OK", 4, ML + 5_000, 0),
         ("OK", 5, ML + 6_000, 1_000)],
    ),
    (
        "not_before pushes the slot, later grants queue behind it",
        [at(0), grant("a", ML + 5_000), grant("b"), grant("c", 100), grant("d", ML + 9_000)],
        [("OK", 1, ML + 5_000, ML + 5_000), ("OK", 2, ML + 6_000, ML + 6_000),
         ("OK", 3, ML + 7_000, ML + 7_000), ("OK", 4, ML + 9_000, ML + 9_000)],
    ),
    (
        "a negative not_before is ignored",
        [at(0), grant("a", -5_000)],
        [("OK", 1, ML + 1_000, ML + 1_000)],
    ),
    (
        "grant while paused: virtual time frozen, flagged paused",
        [at(-ML), grant("a"), at(500), PAUSE, at(1_200), grant("b"), STATUS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, 1_500, "paused"),
         ("status", 2, 2_500, I_US, True)],
    ),
    (
        "a redelivered copy gets its ticket and slot again (also while paused): no slot wasted",
        [at(-ML), grant("a"), grant("b"), at(500), grant("a"), PAUSE, at(900), grant("b"),
         STATUS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000), ("OK", 1, 1_000, 500),
         ("OK", 2, 2_000, 1_500, "paused"), ("status", 2, 2_500, I_US, True)],
    ),
    (
        "a copy whose slot a later start passed takes a new ticket at the tail",
        [at(-ML), grant("a"), grant("b"), at(2_000), claim("b"), grant("a"), grant("a")],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000), ("OK", 0),
         ("OK", 3, 3_000, 1_000), ("OK", 3, 3_000, 1_000)],
    ),
    (
        "a copy of a claimed task takes a new ticket and is HELD by the lease",
        [at(-ML), grant("a"), at(1_000), claim("a"), grant("a"), claim("a", "w2")],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 0), ("OK", 2, 2_000, 1_000),
         ("HELD", 10 * I_US)],
    ),
    (
        "a granted slot is not reused across a new epoch (state lost)",
        [at(-ML), grant("a"), at(100), ("lose_state",), grant("a")],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 1, ML + 1_100, ML + 1_000)],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "steps", "expected"), GRANT_TABLE, ids=[t[0] for t in GRANT_TABLE]
)
def test_grant(name: str, steps: list[Step], expected: list[Any]) -> None:
    run_table(steps, expected)


# -- claim: WAIT, OK, RETICKET, lead -------------------------------------------------------

CLAIM_TABLE = [
    (
        "the first claim of a new epoch waits max lead + one interval",
        [at(0), grant("a"), claim("a"), at(ML + 999), claim("a"), at(ML + 1_000), claim("a")],
        [("OK", 1, ML + 1_000, ML + 1_000), ("WAIT", ML + 1_000), ("WAIT", 1), ("OK", 0)],
    ),
    (
        "WAIT is earliest - v, earliest = max(slot, last_start + interval)",
        [at(-ML), grant("a"), grant("b"), at(1_000), claim("a"), at(1_500), claim("b"),
         at(2_300), claim("b"), grant("c"), at(3_000), claim("c"), at(3_300), claim("c"),
         RECORD],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000), ("OK", 0), ("WAIT", 500),
         ("OK", 0), ("OK", 3, 3_000, 700), ("WAIT", 300), ("OK", 0),
         ("record", 4_000, 3, 3_000, 3_300)],
    ),
    (
        "RETICKET on epoch change: state lost between grant and claim",
        [at(-ML), grant("a"), at(100), LOSE, at(1_000), claim("a"), grant("a"),
         at(ML + 2_000), claim("a")],
        [("OK", 1, 1_000, ML + 1_000), ("RETICKET",), ("OK", 1, ML + 2_000, ML + 1_000),
         ("OK", 0)],
    ),
    (
        "RETICKET when a later ticket already started (slot < current_slot)",
        [at(-ML), grant("a"), grant("b"), at(2_000), claim("b"), claim("a"), grant("a"),
         at(3_000), claim("a")],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000), ("OK", 0), ("RETICKET",),
         ("OK", 3, 3_000, 1_000), ("OK", 0)],
    ),
    (
        "an equal slot is not passed (a re-claim after a lease expired)",
        [at(-ML), grant("a"), at(1_000), claim("a", lease_us=500), at(1_600),
         claim("a", "w2"), RECORD],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 0), ("WAIT", 400),
         ("record", 2_000, 1, 1_000, 1_000)],
    ),
    (
        "lead: OK up to lead early, start_in > 0, starts still one interval apart",
        [at(-ML), grant("a"), grant("b"), grant("c"), at(994), claim("a", lead_us=5),
         at(995), claim("a", lead_us=5), at(1_979), claim("b", lead_us=20),
         at(1_980), claim("b", lead_us=20), at(2_990), claim("c", lead_us=10), STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000),
         ("OK", 3, 3_000, ML + 3_000), ("WAIT", 6), ("OK", 5), ("WAIT", 21), ("OK", 20),
         ("OK", 10), ("starts", 1_000, 2_000, 3_000)],
    ),
    (
        "lead after a late start: earliest follows last_start, the gap stays one interval",
        [at(-ML), grant("a"), grant("b"), at(1_500), claim("a"), at(1_995),
         claim("b", lead_us=10), at(2_490), claim("b", lead_us=10), STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000), ("OK", 0), ("WAIT", 505),
         ("OK", 10), ("starts", 1_500, 2_500)],
    ),
    (
        "a lead longer than the interval still never brings two starts closer",
        [at(-ML), grant("a"), grant("b"), at(0), claim("a", lead_us=5_000),
         claim("b", lead_us=5_000), STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000), ("OK", 1_000),
         ("OK", 2_000), ("starts", 1_000, 2_000)],
    ),
    (
        "a lead beyond MAX_LEAD_US is clamped to it, a negative lead to 0",
        [at(-ML), grant("a"), grant("b"), at(1_000 - ML - 1), claim("a", lead_us=3 * ML),
         at(1_000 - ML), claim("a", lead_us=3 * ML), at(1_999), claim("b", lead_us=-500),
         at(2_000), claim("b", lead_us=-500), STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000), ("WAIT", ML + 1),
         ("OK", ML), ("WAIT", 1), ("OK", 0), ("starts", 1_000, 2_000)],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "steps", "expected"), CLAIM_TABLE, ids=[t[0] for t in CLAIM_TABLE]
)
def test_claim(name: str, steps: list[Step], expected: list[Any]) -> None:
    run_table(steps, expected)


# -- leases, done, renew ---------------------------------------------------------------------

LEASE_TABLE = [
    (
        "HELD while another holder's lease runs, OK once it expires without done",
        [at(-ML), grant("a"), at(1_000), claim("a", "w1", lease_us=5_000), claim("a", "w2"),
         at(3_000), claim("a", "w2"), at(6_000), claim("a", "w2"), claim("a", "w1")],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 0), ("HELD", 5_000), ("HELD", 3_000), ("OK", 0),
         ("HELD", 10_000)],
    ),
    (
        "the same holder re-claiming before its start gets it again (idempotent); once that "
        "start passed unheard (a lost reply, a pool process late) and no start was admitted "
        "since, it moves to now, again each time",
        [at(-ML), grant("a"), at(990), claim("a", lead_us=20), RECORD, at(995),
         claim("a", lead_us=20), at(1_200), claim("a"), RECORD, at(2_000), claim("a"), RECORD,
         STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 10), ("record", 2_000, 1, 1_000, 1_000),
         ("OK", 5), ("OK", 0), ("record", 2_000, 1, 1_000, 1_200), ("OK", 0),
         ("record", 2_000, 1, 1_000, 2_000), ("starts", 1_000, 1_000, 1_200, 2_000)],
    ),
    (
        "a missed start moved to now pushes the tickets still waiting back by as much: each "
        "comes an interval after the one before, none at the same earliest start",
        [at(-ML), grant("a"), grant("b"), grant("c"), at(1_000), claim("a"), at(1_500),
         claim("a"), RECORD, at(2_000), claim("b", "w2"), at(2_500), claim("b", "w2"),
         at(3_000), claim("c", "w3"), STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000), ("OK", 3, 3_000, ML + 3_000),
         ("OK", 0), ("OK", 0), ("record", 4_000, 3, 1_000, 1_500), ("WAIT", 500), ("OK", 0),
         ("WAIT", 500), ("starts", 1_000, 1_500, 2_500)],
    ),
    (
        "a missed start after which another was admitted: a new start an interval after the "
        "last, and the tickets still waiting pushed back one interval",
        [at(-ML), grant("a"), grant("b"), grant("c"), at(1_000), claim("a"), at(2_000),
         claim("b", "w2"), at(2_100), claim("a"), at(3_000), claim("a"), claim("c", "w3"),
         at(4_000), claim("c", "w3"), STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000), ("OK", 3, 3_000, ML + 3_000),
         ("OK", 0), ("OK", 0), ("WAIT", 900), ("OK", 0), ("WAIT", 1_000), ("OK", 0),
         ("starts", 1_000, 2_000, 3_000, 4_000)],
    ),
    (
        "DUPLICATE after done: in grant and in claim, for every holder",
        [at(-ML), grant("a"), at(1_000), claim("a"), done("a"), grant("a"), claim("a", "w2"),
         claim("a", "w1")],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 0), ("DUPLICATE",), ("DUPLICATE",),
         ("DUPLICATE",)],
    ),
    (
        "a retry of the same task id (other retries) is not a duplicate",
        [at(-ML), grant("a"), at(1_000), claim("a"), done("a"), grant("a", retries=1),
         at(2_000), claim("a", "w2", retries=1), grant("a")],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 0), ("OK", 2, 2_000, 1_000), ("OK", 0),
         ("DUPLICATE",)],
    ),
    (
        "done before the claim (acked copy elsewhere): a waiting copy is a DUPLICATE",
        [at(-ML), grant("a"), done("a"), at(1_000), claim("a"), STATUS],
        [("OK", 1, 1_000, ML + 1_000), ("DUPLICATE",), ("status", 1, 1_000, I_US, False)],
    ),
    (
        "a done mark expires after dedupe_ttl",
        [at(-ML), grant("a"), done("a", ttl_us=ML + 3_000), at(2_999), grant("a"), at(3_000),
         grant("a")],
        [("OK", 1, 1_000, ML + 1_000), ("DUPLICATE",), ("OK", 2, 3_000, 0)],
    ),
    (
        "renew extends the holder's live lease; others and expired leases get False",
        [at(-ML), grant("a"), at(1_000), claim("a", "w1", lease_us=1_000), at(1_500),
         renew("a", "w1", 1_000), renew("a", "w2", 1_000), at(2_200), claim("a", "w2"),
         at(2_600), renew("a", "w1", 1_000), claim("a", "w2")],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 0), ("renewed", True), ("renewed", False),
         ("HELD", 300), ("renewed", False), ("OK", 0)],
    ),
    (
        "renew without any mark is False and creates none",
        [at(0), renew("a", "w1", 1_000)],
        [("renewed", False)],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "steps", "expected"), LEASE_TABLE, ids=[t[0] for t in LEASE_TABLE]
)
def test_lease(name: str, steps: list[Step], expected: list[Any]) -> None:
    run_table(steps, expected)


# -- pause, unpause, set_interval -------------------------------------------------------------

CONTROL_TABLE = [
    (
        "pause/unpause shifts every granted slot by exactly the pause length, no re-ticket",
        [at(-ML), grant("a"), grant("b"), at(500), PAUSE, at(1_200), claim("a"), grant("c"),
         at(2_500), UNPAUSE, claim("a"), at(3_000), claim("a"), at(4_000), claim("b"),
         at(5_000), claim("c"), STARTS, RECORD],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000), ("PAUSED",),
         ("OK", 3, 3_000, 2_500, "paused"), ("WAIT", 500), ("OK", 0), ("OK", 0), ("OK", 0),
         ("starts", 3_000, 4_000, 5_000), ("record", 4_000, 3, 3_000, 3_000)],
    ),
    (
        "pause and unpause are idempotent; pausing an unknown bucket creates a paused epoch",
        [at(0), PAUSE, PAUSE, STATUS, at(700), UNPAUSE, UNPAUSE, STATUS, grant("a"),
         at(ML + 1_700), claim("a")],
        [("status", 0, ML + 1_000, I_US, True), ("status", 0, ML + 1_000, I_US, False),
         ("OK", 1, ML + 1_000, ML + 1_000), ("OK", 0)],
    ),
    (
        "unpause of an unknown bucket starts an unpaused new epoch",
        [at(0), UNPAUSE, STATUS],
        [("status", 0, ML + 1_000, I_US, False)],
    ),
    (
        "a pause in the middle of a WAIT stretches it by the pause length",
        [at(-ML), grant("a"), at(400), claim("a"), PAUSE, at(900), UNPAUSE, claim("a"),
         at(1_500), claim("a")],
        [("OK", 1, 1_000, ML + 1_000), ("WAIT", 600), ("WAIT", 600), ("OK", 0)],
    ),
    (
        "set_interval up: tat pushed by the difference, claims follow the new spacing",
        [at(-ML), grant("a"), grant("b"), at(1_000), claim("a"), set_interval(3_000), STATUS,
         grant("c"), at(2_000), claim("b"), at(4_000), claim("b"), at(5_000), claim("c"),
         at(7_000), claim("c"), STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000), ("OK", 0),
         ("status", 2, 4_000, 3_000, False), ("OK", 3, 5_000, 4_000), ("WAIT", 2_000),
         ("OK", 0), ("WAIT", 2_000), ("OK", 0), ("starts", 1_000, 4_000, 7_000)],
    ),
    (
        "set_interval up also lengthens the new epoch's first wait",
        [at(0), grant("a"), set_interval(3_000), at(ML + 1_000), claim("a"), at(ML + 3_000),
         claim("a")],
        [("OK", 1, ML + 1_000, ML + 1_000), ("WAIT", 2_000), ("OK", 0)],
    ),
    (
        "set_interval down: tat never moves back, new grants and claims use the new spacing",
        [at(-ML), grant("a"), grant("b"), grant("c"), set_interval(250), STATUS, grant("d"),
         grant("e"), at(1_000), claim("a"), at(1_250), claim("b"), at(2_000), claim("b"),
         at(3_000), claim("c"), at(4_000), claim("d"), at(4_250), claim("e"), STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000),
         ("OK", 3, 3_000, ML + 3_000), ("status", 3, ML + 4_000, 250, False),
         ("OK", 4, 4_000, ML + 4_000), ("OK", 5, 4_250, ML + 4_250), ("OK", 0), ("WAIT", 750),
         ("OK", 0), ("OK", 0), ("OK", 0), ("OK", 0),
         ("starts", 1_000, 2_000, 3_000, 4_000, 4_250)],
    ),
    (
        "set_interval down lets a late queue catch up at the new spacing",
        [at(-ML), grant("a"), grant("b"), set_interval(250), at(5_000), claim("a"), claim("b"),
         at(5_250), claim("b"), STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000), ("OK", 0), ("WAIT", 250),
         ("OK", 0), ("starts", 5_000, 5_250)],
    ),
    (
        "unset_interval down: the configured interval is back, tat and granted slots are kept",
        [at(-ML), grant("a"), set_interval(3_000), grant("b"), UNSET, STATUS, grant("c"),
         at(1_000), claim("a"), at(4_000), claim("b"), at(7_000), claim("c"), STARTS, RECORD],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 4_000, ML + 4_000), ("dropped", True),
         ("status", 2, ML + 7_000, I_US, False), ("OK", 3, 7_000, ML + 7_000), ("OK", 0),
         ("OK", 0), ("OK", 0), ("starts", 1_000, 4_000, 7_000),
         ("record", 8_000, 3, 7_000, 7_000)],
    ),
    (
        "unset_interval up: tat pushed by the difference, claims follow the configured spacing",
        [at(-ML), set_interval(250), grant("a"), grant("b"), UNSET, grant("c"), at(1_000),
         claim("a"), at(1_250), claim("b"), at(2_000), claim("b"), at(2_250), claim("c"),
         at(3_000), claim("c"), STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 1_250, ML + 1_250), ("dropped", True),
         ("OK", 3, 2_250, ML + 2_250), ("OK", 0), ("WAIT", 750), ("OK", 0), ("WAIT", 750),
         ("OK", 0), ("starts", 1_000, 2_000, 3_000)],
    ),
    (
        "unset_interval keeps a pause, the epoch and the tickets",
        [at(-ML), grant("a"), set_interval(3_000), PAUSE, UNSET, STATUS, UNSET, at(500),
         UNPAUSE, at(1_500 + ML), claim("a"), RECORD],
        [("OK", 1, 1_000, ML + 1_000), ("dropped", True), ("status", 1, ML + 4_000, I_US, True),
         ("dropped", False), ("OK", 0), ("record", 4_000, 1, 1_000, 1_000)],
    ),
    (
        "unset_interval with no state or no override changes nothing",
        [at(0), UNSET, STATUS, grant("a"), UNSET, RECORD],
        [("dropped", False), ("status", 0, ML + 1_000, I_US, False),
         ("OK", 1, ML + 1_000, ML + 1_000), ("dropped", False),
         ("record", ML + 2_000, 1, -T0_US, ML)],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "steps", "expected"), CONTROL_TABLE, ids=[t[0] for t in CONTROL_TABLE]
)
def test_control(name: str, steps: list[Step], expected: list[Any]) -> None:
    run_table(steps, expected)


# -- throttle ---------------------------------------------------------------------------------

THROTTLE_TABLE = [
    (
        "no start for retry_after; the throttled task keeps the first slot, the rest follow",
        [at(-ML), grant("a"), grant("b"), grant("c"), at(1_000), claim("a"), at(1_200),
         throttle("a", 3_000), at(2_000), claim("b"), grant("a"), at(4_199), claim("a"),
         at(4_200), claim("a"), claim("b"), at(5_200), claim("b"), at(6_200), claim("c"),
         STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000),
         ("OK", 3, 3_000, ML + 3_000), ("OK", 0), ("throttled", 5_000), ("WAIT", 3_200),
         ("OK", 1, 2_000, 2_200), ("WAIT", 1), ("OK", 0), ("WAIT", 1_000), ("OK", 0),
         ("OK", 0), ("starts", 1_000, 4_200, 5_200, 6_200)],
    ),
    (
        "a short retry_after: the throttled task still takes the next slot, ahead of b",
        [at(-ML), grant("a"), grant("b"), at(1_000), claim("a"), at(1_100), throttle("a", 0),
         at(2_000), claim("b"), grant("a"), claim("a"), at(3_000), claim("b"), STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000), ("OK", 0),
         ("throttled", 1_900), ("WAIT", 1_000), ("OK", 1, 2_000, 0), ("OK", 0), ("OK", 0),
         ("starts", 1_000, 2_000, 3_000)],
    ),
    (
        "a throttled task that never comes back costs one interval",
        [at(-ML), grant("a"), grant("b"), at(1_000), claim("a"), throttle("a", 0), at(2_000),
         claim("b"), at(3_000), claim("b"), STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000), ("OK", 0),
         ("throttled", 2_000), ("WAIT", 1_000), ("OK", 0), ("starts", 1_000, 3_000)],
    ),
    (
        "the throttled run's ack keeps the place; the ack of the run that follows marks done",
        [at(-ML), grant("a"), at(1_000), claim("a"), throttle("a", 500), done("a"), grant("a"),
         at(2_000), claim("a"), done("a"), grant("a")],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 0), ("throttled", 2_000), ("OK", 1, 2_000, 1_000),
         ("OK", 0), ("DUPLICATE",)],
    ),
    (
        "throttles back to back: each throttled task keeps a slot, in the order of the throttles",
        [at(-ML), grant("a"), grant("b"), grant("c"), at(1_000), claim("a"), at(2_000),
         claim("b"), at(2_100), throttle("a", 3_000), at(2_200), throttle("b", 3_000),
         grant("a"), grant("b"), at(5_200), claim("b"), claim("c"), claim("a"), at(6_200),
         claim("c"), claim("b"), at(7_200), claim("c"), STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000),
         ("OK", 3, 3_000, ML + 3_000), ("OK", 0), ("OK", 0), ("throttled", 4_000),
         ("throttled", 5_000), ("OK", 1, 3_000, 3_000), ("OK", 1, 4_000, 4_000),
         ("WAIT", 1_000), ("WAIT", 2_000), ("OK", 0), ("WAIT", 1_000), ("OK", 0), ("OK", 0),
         ("starts", 1_000, 2_000, 5_200, 6_200, 7_200)],
    ),
    (
        "a throttled copy that comes after its kept slot goes after the later kept slots",
        [at(-ML), grant("a"), grant("b"), grant("c"), at(1_000), claim("a"), at(2_000),
         claim("b"), at(2_100), throttle("a", 3_000), at(2_200), throttle("b", 3_000),
         grant("a"), grant("b"), at(6_100), claim("a"), at(6_200), claim("b"), at(7_200),
         claim("a"), at(8_200), claim("c"), STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000),
         ("OK", 3, 3_000, ML + 3_000), ("OK", 0), ("OK", 0), ("throttled", 4_000),
         ("throttled", 5_000), ("OK", 1, 3_000, 3_000), ("OK", 1, 4_000, 4_000),
         ("WAIT", 1_100), ("OK", 0), ("OK", 0), ("OK", 0),
         ("starts", 1_000, 2_000, 6_200, 7_200, 8_200)],
    ),
    (
        "a start admitted before a throttle and claimed again late waits the throttle out",
        [at(-ML), grant("a"), grant("b"), at(1_000), claim("a"), at(2_000), claim("b", "w2"),
         at(2_100), throttle("a", 3_000), at(2_500), claim("b", "w2"), grant("a"), at(4_099),
         claim("b", "w2"), at(5_100), claim("a"), claim("b", "w2"), at(6_095),
         claim("b", "w2", 5), claim("b", "w2", 5), STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000), ("OK", 0), ("OK", 0),
         ("throttled", 4_000), ("WAIT", 3_600), ("OK", 1, 3_000, 2_600), ("WAIT", 2_001),
         ("OK", 0), ("WAIT", 1_000), ("OK", 5), ("OK", 5), ("starts", 1_000, 2_000, 5_100, 6_100,
         6_100)],
    ),
    (
        "a throttle while paused waits its retry_after after the unpause",
        [at(-ML), grant("a"), grant("b"), at(1_000), claim("a"), PAUSE, throttle("a", 2_000),
         at(5_000), UNPAUSE, grant("a"), claim("a"), at(7_000), claim("a"), STARTS],
        [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000), ("OK", 0),
         ("throttled", 3_000), ("OK", 1, 2_000, 2_000), ("WAIT", 2_000), ("OK", 0),
         ("starts", 1_000, 7_000)],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "steps", "expected"), THROTTLE_TABLE, ids=[t[0] for t in THROTTLE_TABLE]
)
def test_throttle(name: str, steps: list[Step], expected: list[Any]) -> None:
    run_table(steps, expected)


def test_state_loss_after_a_lead_claim_keeps_spacing() -> None:
    """P5 across state loss: the lost state had admitted a start a full MAX_LEAD_US ahead.

    Every claim uses the largest lead, so each start lies MAX_LEAD_US after its claim; the new
    epoch assumes exactly that, and its first start still comes one interval after the last one.
    """
    steps = [at(-ML), grant("a"), grant("b"), at(1_000 - ML), claim("a", lead_us=ML),
             at(2_000 - ML), claim("b", lead_us=ML), LOSE, grant("c"), at(3_000 - ML - 1),
             claim("c", lead_us=ML), at(3_000 - ML), claim("c", lead_us=ML), STARTS]  # fmt: skip
    result = Model().run(steps)
    assert result == [("OK", 1, 1_000, ML + 1_000), ("OK", 2, 2_000, ML + 2_000), ("OK", ML),
                      ("OK", ML), ("OK", 1, 3_000, ML + 1_000), ("WAIT", ML + 1), ("OK", ML),
                      ("starts", 1_000, 2_000, 3_000)]  # fmt: skip
    starts = result[-1][1:]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= I_US, f"starts {starts} have gaps {gaps} < {I_US}"


# -- properties over random operation sequences ------------------------------------------------

ops = st.one_of(
    st.tuples(st.just("advance"), st.integers(0, 3_000)),
    st.tuples(st.just("advance"), st.integers(0, 30)),
    st.tuples(st.just("advance"), st.integers(0, 3 * ML)),
    st.tuples(
        st.just("grant"), st.sampled_from(TASKS), st.integers(0, 1),
        st.sampled_from([0, 0, 500, 2_500]),
    ),
    st.tuples(
        st.just("claim"), st.sampled_from(TASKS), st.integers(0, 1), st.sampled_from(HOLDERS),
        st.sampled_from([0, 0, 3, 50, 400, ML, 3 * ML]), st.sampled_from([500, 5_000]),
    ),
    st.tuples(
        st.just("done"), st.sampled_from(TASKS), st.integers(0, 1),
        st.sampled_from([1_000, 50_000]),
    ),
    st.tuples(
        st.just("renew"), st.sampled_from(TASKS), st.integers(0, 1), st.sampled_from(HOLDERS),
        st.sampled_from([500, 5_000]),
    ),
    st.tuples(
        st.just("advance_to_due"), st.sampled_from(TASKS), st.integers(0, 1),
        st.sampled_from([0, 3, 50, 400, ML]), st.sampled_from([-1, 0, 1]),
    ),
    st.tuples(  # the latest grant: advance_to_due, then claim it with that lead
        st.just("claim_due"), st.sampled_from(HOLDERS), st.sampled_from([0, 50, ML, 3 * ML]),
        st.sampled_from([500, 5_000]), st.sampled_from([-1, 0, 1]),
    ),
    st.tuples(  # the latest claim again, by its holder: a lost reply, a pool process late
        st.just("claim_again"), st.sampled_from([0, 50, ML]),
    ),
    st.tuples(st.just("pause")),
    st.tuples(st.just("unpause")),
    st.tuples(
        st.just("throttle"), st.sampled_from(TASKS), st.integers(0, 1),
        st.sampled_from([0, 500, 5_000]), st.sampled_from([None, None, 1_500, 50_000]),
    ),
    st.tuples(st.just("set_interval"), st.sampled_from([200, 1_000, 3_000])),
    st.tuples(st.just("unset_interval")),
    st.tuples(st.just("lose")),
    st.tuples(st.just("advance"), st.integers(IDLE_US, IDLE_US + 3_000)),
    st.tuples(st.just("advance_to_expiry"), st.sampled_from([-1, 0, 1])),
    st.tuples(st.just("expire")),
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(ops, max_size=80))
def test_random_sequences_keep_spacing_and_never_travel_back(steps: list[Step]) -> None:
    """P5: new starts (now + start_in, real time) are >= the interval apart, also across state
    loss (no slack: a new epoch assumes a start MAX_LEAD_US ahead); P8 within an epoch."""
    check_sequence(steps)


#: Claims, throttles and claims again by a lease's holder, close together (P9).
throttle_ops = st.one_of(
    st.tuples(st.just("grant"), st.sampled_from(TASKS), st.integers(0, 1), st.just(0)),
    st.tuples(
        st.just("claim_due"), st.sampled_from(HOLDERS), st.sampled_from([0, 50, ML]),
        st.just(5_000), st.sampled_from([-1, 0, 1]),
    ),
    st.tuples(st.just("claim_again"), st.sampled_from([0, 50, ML])),
    st.tuples(
        st.just("throttle"), st.sampled_from(TASKS), st.integers(0, 1),
        st.sampled_from([0, 500, 2_500, 5_000]), st.sampled_from([None, None, 50_000]),
    ),
    st.tuples(st.just("advance"), st.integers(0, 3_000)),
    st.tuples(st.just("pause")),
    st.tuples(st.just("unpause")),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(throttle_ops, max_size=40))
def test_random_throttles_leave_no_start_inside_their_wait(steps: list[Step]) -> None:
    """P9, aimed: no start inside a throttle's retry_after, also none claimed again by a
    lease's holder (a lost reply, a pool process late) whose start a throttle moved."""
    check_sequence(steps)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.just("claim_due"), st.sampled_from(HOLDERS),
                  st.one_of(st.integers(-50, 3 * ML), st.sampled_from([0, ML])),
                  st.just(5_000), st.sampled_from([-1, 0, 1])),
        min_size=1, max_size=3,
    ),
    st.one_of(st.just(0), st.integers(0, 2 * ML)),
    st.sampled_from([None, 200, 3_000]),
    st.tuples(st.just("claim_due"), st.sampled_from(HOLDERS),
              st.one_of(st.integers(-50, 3 * ML), st.sampled_from([0, ML])),
              st.just(5_000), st.sampled_from([-1, 0, 1])),
)  # fmt: skip
def test_state_loss_right_after_lead_claims_keeps_spacing(
    claims: list[Step], lose_after_us: int, new_interval_us: int | None, claim_after: Step
) -> None:
    """P5 across state loss, aimed: lead claims, the store loses its state, a new epoch claims."""
    steps: list[Step] = []
    for i, c in enumerate(claims):
        steps += [("grant", TASKS[i], 0, 0), c]
    steps += [("advance", lose_after_us), ("lose",)]
    if new_interval_us is not None:
        steps.append(("set_interval", new_interval_us))
    steps += [("grant", "d", 0, 0), claim_after]
    check_sequence(steps)


def test_handoff_keeps_a_late_claim_start_in_the_future() -> None:
    """A claim on time starts at its slot; a late one still leaves ``handoff`` for the hand-off."""
    state, _, g = schedule.grant(None, None, 0, Pace(1_000), born_us=0)
    slot = g.slot_us
    on_time = schedule.claim(
        state, None, slot - 500, 1_000, g.slot, ClaimTerms("h", 10**6, 600, 300), born_us=0
    )
    assert on_time[2] == Claim(Outcome.OK, g.epoch, 500, slot - 500)
    late = schedule.claim(
        state, None, slot + 50, 1_000, g.slot, ClaimTerms("h", 10**6, 600, 300), born_us=0
    )
    assert late[2] == Claim(Outcome.OK, g.epoch, 300, slot + 50)
    assert late[0].last_start_us == slot + 350
    capped = schedule.claim(
        state, None, slot + 50, 1_000, g.slot, ClaimTerms("h", 10**6, 100, 900), born_us=0
    )
    assert capped[2].delay_us == 100, "handoff is capped at lead"


def test_handoff_is_at_most_one_interval() -> None:
    """With an interval shorter than the handoff, a late claim's start is one interval away:
    a longer wait would only idle the pool process that holds the task."""
    state, _, g = schedule.grant(None, None, 0, Pace(200), born_us=0)
    late = schedule.claim(state, None, g.slot_us + 50, 200, g.slot,
                          ClaimTerms("h", 10**6, 600, 300), born_us=0)  # fmt: skip
    assert late[2].delay_us == 200


def test_take_is_a_grant_then_a_claim_when_the_slot_is_due() -> None:
    """``take`` equals ``grant`` followed at the same instant by ``claim`` of its slot when that
    slot is due within the lead; otherwise (later slot, paused, done) it is ``grant`` alone."""
    state, _, first = schedule.grant(None, None, 0, Pace(1_000), born_us=0)
    now = first.slot_us - 400  # the next slot is one interval after the first's
    for lead_us, claims in ((600, False), (1_600, True)):
        terms = ClaimTerms("h", 10**6, lead_us, 300)
        grant_only = schedule.grant(state, None, now, Pace(1_000), born_us=0)
        claim_then = schedule.claim(
            grant_only[0], grant_only[1], now, 1_000, grant_only[2].slot, terms, born_us=0
        )
        taken = schedule.take(state, None, now, Pace(1_000), terms, born_us=0)
        if claims:
            assert taken == (claim_then[0], claim_then[1], grant_only[2], claim_then[2])
            assert taken[3] is not None and taken[3].outcome is Outcome.OK
        else:
            assert taken == (*grant_only, None)
    paused = schedule.pause(state, now, 1_000, born_us=0)
    terms = ClaimTerms("h", 10**6, 20_000)
    assert schedule.take(paused, None, now, Pace(1_000), terms, born_us=0)[3] is None
    done = schedule.done(now, 10**6)
    taken = schedule.take(state, done, now, Pace(1_000), terms, born_us=0)
    assert taken[2].outcome is Outcome.DUPLICATE and taken[3] is None


def test_take_of_a_copy_whose_task_runs_under_another_lease_is_held_without_a_ticket() -> None:
    """A copy taken while another holder's lease is live is HELD for the lease left and takes
    no ticket (its slot would go unused); its own holder's retry (a lost reply) claims again."""
    state, mark, first = schedule.grant(None, None, 0, Pace(1_000), born_us=0)
    state, mark, claimed = schedule.claim(
        state, mark, first.slot_us, 1_000, first.slot, ClaimTerms("h1", 10**6, 0), born_us=0
    )
    assert claimed.outcome is Outcome.OK
    now = first.slot_us + 5_000
    h2, h1 = ClaimTerms("h2", 10**6, 20_000), ClaimTerms("h1", 10**6, 20_000)
    taken = schedule.take(state, mark, now, Pace(1_000), h2, born_us=0)
    assert taken[0] == state and taken[1] == mark and taken[3] is None
    assert taken[2].outcome is Outcome.HELD and taken[2].ticket == 0
    assert taken[2].delay_us == first.slot_us + 10**6 - now
    own = schedule.take(state, mark, now, Pace(1_000), h1, born_us=0)
    assert own[2].outcome is Outcome.OK and own[3] is not None
    assert own[3].outcome is Outcome.OK
    expired = schedule.take(state, mark, first.slot_us + 10**6, Pace(1_000), h2, born_us=0)
    assert expired[2].outcome is Outcome.OK and expired[2].ticket == state.ticket + 1


# -- the birth marker: a new bucket starts at once unless the store may have lost a start ---------

BORN_TABLE = [
    (
        "under an old marker a new bucket's first start is at once, the next one interval later",
        OLD_BORN_US,
        [at(0), grant("a"), claim("a"), grant("b"), at(999), claim("b"), at(1_000), claim("b"),
         STARTS],
        [("OK", 1, 0, 0), ("OK", 0), ("OK", 2, 1_000, 1_000), ("WAIT", 1), ("OK", 0),
         ("starts", 0, 1_000)],
    ),
    (
        "a marker younger than one interval + MAX_LEAD_US holds the first start to that",
        T0_US - 500,
        [at(0), grant("a"), at(ML + 499), claim("a"), at(ML + 500), claim("a")],
        [("OK", 1, ML + 500, ML + 500), ("WAIT", 1), ("OK", 0)],
    ),
    (
        "the marker is set by the first state a store makes: a new store waits (status sets none)",
        None,
        [at(0), STATUS, at(300), grant("a")],
        [("status", 0, ML + 1_000, I_US, False), ("OK", 1, ML + 1_300, ML + 1_000)],
    ),
    (
        "a store that lost everything gets a new marker: its first start waits again",
        OLD_BORN_US,
        [at(0), grant("a"), claim("a"), at(300), LOSE, grant("b"), at(ML + 1_299), claim("b"),
         at(ML + 1_300), claim("b"), STARTS],
        [("OK", 1, 0, 0), ("OK", 0), ("OK", 1, ML + 1_300, ML + 1_000), ("WAIT", 1), ("OK", 0),
         ("starts", 0, ML + 1_300)],
    ),
    (
        "a reset keeps the next epoch's first start one interval + MAX_LEAD_US away",
        OLD_BORN_US,
        [at(0), grant("a"), claim("a"), at(300), ("lose_state",), STATUS, grant("b"),
         at(ML + 1_300), claim("b"), STARTS],
        [("OK", 1, 0, 0), ("OK", 0), ("status", 0, ML + 1_000, I_US, False),
         ("OK", 1, ML + 1_300, ML + 1_000), ("OK", 0), ("starts", 0, ML + 1_300)],
    ),
    (
        "an idle state is dropped only at max(tat, last_start + interval) + IDLE_GRACE_US",
        OLD_BORN_US,
        [at(0), grant("a"), claim("a"), grant("b"), at(IDLE_US + 1_999), ("expire",), STATUS,
         at(IDLE_US + 2_000), ("expire",), STATUS, grant("c"), claim("c"), STARTS],
        [("OK", 1, 0, 0), ("OK", 0), ("OK", 2, 1_000, 1_000), ("status", 2, 0, I_US, False),
         ("status", 0, 0, I_US, False), ("OK", 1, IDLE_US + 2_000, 0), ("OK", 0),
         ("starts", 0, IDLE_US + 2_000)],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "born_us", "steps", "expected"), BORN_TABLE, ids=[t[0] for t in BORN_TABLE]
)
def test_born(name: str, born_us: int | None, steps: list[Step], expected: list[Any]) -> None:
    run_table(steps, expected, born_us)


def test_new_state_waits_only_for_a_young_marker() -> None:
    now = 10**9
    old = schedule.new_state(now, 1_000, born_us=now - 10**6)
    assert (old.last_start_us, old.tat_us, old.epoch) == (now - 1_000, now, now)
    young = schedule.new_state(now, 1_000, born_us=now)
    assert (young.last_start_us, young.tat_us) == (now + ML, now + ML + 1_000)
    edge = schedule.new_state(now, 1_000, born_us=now - 1_000 - ML)
    assert replace(edge, lost_start_us=None) == replace(old, lost_start_us=None), (
        "a marker one interval + MAX_LEAD_US old no longer holds a start back (only a burst)"
    )
    assert (old.lost_start_us, edge.lost_start_us) == (now - 10**6 + ML, now - 1_000)


def test_expires_in() -> None:
    """Kept until virtual time reaches tat and last_start + interval, then IDLE_GRACE_US more;
    never less than the grace after a write; never for a paused or overridden bucket."""
    now = 10**9
    new = schedule.new_state(now, 1_000, born_us=0)
    assert schedule.expires_in_us(new, now, 1_000) == IDLE_US
    queued = schedule.grant(new, None, now, Pace(1_000, 5_000), born_us=0)[0]  # tat = now + 6_000
    assert schedule.expires_in_us(queued, now + 100, 1_000) == 5_900 + IDLE_US
    late = BucketState(now, 0, None, now + 1_000, 1, now, now + 700, None)  # a late start
    assert schedule.expires_in_us(late, now, 1_000) == 1_700 + IDLE_US
    assert schedule.expires_in_us(late, now, 3_000) == 3_700 + IDLE_US, "the caller's interval"
    shifted = BucketState(now, 400, None, now + 1_000, 1, now, now + 700, None)
    assert schedule.expires_in_us(shifted, now, 1_000) == 2_100 + IDLE_US, "virtual time"
    paused = schedule.pause(late, now, 1_000, born_us=0)
    assert schedule.expires_in_us(paused, now, 1_000) is None
    overridden = schedule.set_interval(late, now, 1_000, 1_000, born_us=0)
    assert schedule.expires_in_us(overridden, now, 1_000) is None
    resumed = schedule.unpause(paused, now + 10 * IDLE_US, 1_000, born_us=0)
    assert schedule.expires_in_us(resumed, now + 10 * IDLE_US, 1_000) == 1_700 + IDLE_US


@settings(max_examples=300, deadline=None)
@given(
    st.lists(ops, max_size=60),
    st.sampled_from([0, 0, 1, 5_000, IDLE_US]),
    st.sampled_from([0, 0, 500, 2_500]),
    st.sampled_from([0, 50, ML, 3 * ML]),
    st.sampled_from([0, 300]),
)
def test_an_expired_state_acts_as_a_new_one(
    steps: list[Step], after_us: int, not_before_us: int, lead_us: int, handoff_us: int
) -> None:
    """Past ``expires_in_us``, a take and the grant after it get the same answers (but for the
    epoch and ticket numbers) from the kept state as from a new one under the store's marker."""
    m = check_sequence(steps, Model(born_us=OLD_BORN_US))
    if m.state is None or m.expires_real_us is None or m.born_us is None:
        return
    now = m.expires_real_us + after_us
    answers = []
    for state, born_us in ((m.state, now), (None, m.born_us)):
        kept, _mark, g, c = schedule.take(
            state, None, now, Pace(I_US, not_before_us),
            ClaimTerms("h", 10**6, lead_us, handoff_us), born_us=born_us,
        )  # fmt: skip
        after = schedule.grant(kept, None, now, Pace(I_US), born_us=born_us)[2]
        claimed = None if c is None else (c.outcome, c.delay_us)
        answers.append((g.outcome, g.delay_us, g.paused, claimed, after.delay_us))
    assert answers[0] == answers[1]


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, max_size=80))
def test_random_sequences_under_an_old_marker_keep_spacing(steps: list[Step]) -> None:
    """P5 and P8 where new buckets start at once: across idle expiry, resets and state loss."""
    check_sequence(steps, Model(born_us=OLD_BORN_US))


def test_an_adaptive_bucket_slows_when_throttled_and_eases_back_with_clean_starts() -> None:
    """A throttle lengthens the interval by a ninth, one within ``ADAPT_CLEAN_RUN`` starts of
    the last by half (at most the slowest allowed); each clean start adds 1/2000 of the
    configured rate back, until the configured interval ends the adaptation."""
    m = Model()
    m.run([at(-ML), grant("a"), at(1_000), claim("a")])

    def interval_after(*steps: Step) -> tuple[int, bool]:
        m.run(list(steps))
        assert m.state is not None
        st = schedule.status(m.state, m.now_us, I_US, born_us=0)
        return st.interval_us, st.adapted

    assert interval_after(throttle("a", 0, adapt_max_us=100_000)) == (1_112, True)
    assert interval_after(throttle("a", 0, adapt_max_us=100_000)) == (1_668, True)
    assert interval_after(throttle("a", 0, adapt_max_us=2_000)) == (2_000, True)  # the slowest
    assert interval_after(throttle("a", 0)) == (2_000, True)  # not adaptive: kept as it is
    # clean starts: the rate climbs back by 1/2000 of the configured rate each
    seen = []
    for n in range(3_000):
        task = f"t{n}"
        m.run([grant(task)])
        _epoch, slot_us = m.granted[(task, 0)]
        assert m.state is not None
        m.now_us += max(0, slot_us - schedule.virtual_now(m.state, m.now_us) + 10 * I_US)
        m.run([claim(task)])
        seen.append(schedule.effective_interval(m.state, I_US))
        if m.state.adapted_us is None:
            break
    assert seen[0] == 1_998 and seen == sorted(seen, reverse=True)
    # 1/2000 → 1/1000 in steps of 1/2000 of 1/1000: 1000 starts, fewer as each rounds down
    assert seen[-1] == I_US and 600 < len(seen) <= 1_000
    # after a clean run of ADAPT_CLEAN_RUN starts, a throttle slows by a ninth, not double
    assert interval_after(throttle("a", 0, adapt_max_us=100_000)) == (1_112, True)


def test_a_grant_whose_slot_is_past_its_deadline_takes_no_ticket() -> None:
    """``Pace.not_after_in_us`` (``slot()``'s timeout): a slot further than that from now is
    not granted (WAIT with the slot and its delay); nothing changes, no mark is left."""
    now = T0_US
    state, _, first = schedule.grant(None, None, now, Pace(1_000), born_us=0)
    state, _, second = schedule.grant(state, None, now, Pace(1_000), born_us=0)
    late = Pace(1_000, not_after_in_us=second.delay_us + 999)
    after, mark, refused = schedule.grant(state, None, now, late, born_us=0)
    assert (refused.outcome, refused.ticket) == (Outcome.WAIT, 0)
    assert refused.delay_us == second.delay_us + 1_000
    assert after == state and mark is None
    soon = Pace(1_000, not_after_in_us=second.delay_us + 1_000)
    _, mark, granted = schedule.grant(state, None, now, soon, born_us=0)
    assert (granted.outcome, granted.ticket) == (Outcome.OK, 3) and mark is not None
    assert first.ticket == 1
