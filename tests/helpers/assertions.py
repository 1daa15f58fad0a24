"""Assertions on a test pool's run: each task once, starts spaced on the store's clock and on
this host's, tickets in order, one admitted start per task, no start inside a throttle."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from typing import Any

from celery_interval.schedule.state import MAX_LEAD_US
from tests.helpers.ledgers import claim_times_us, ledger
from tests.helpers.pool import Pool, gaps_us


def body_floor_us(interval_s: float) -> int:
    """Body starts may come this close: the interval less what OS scheduling can add."""
    return round((interval_s - max(0.1 * interval_s, 0.003)) * 1e6)


def late_us(interval_s: float) -> int:
    """A wake later than this can put a body start below the floor."""
    return round(interval_s * 1e6) - body_floor_us(interval_s)


#: Share of body-start gaps that must clear the floor on a quiet machine. This VM wakes a
#: sleeping process more than 3 ms late in ~1.6 % of sleeps even when idle (bench/wakeup.py),
#: so a few bodies start late whatever the library does; the deadlines it hands out, and that
#: no body starts before its deadline, are checked for every task.
BODY_FLOOR_SHARE = 0.97


#: A body's start waits on more wakes than the probe's one (the worker's timer, the hand-off to
#: the pool process, the pool process): each late wake of the probe beside the workers allows
#: this many more late starts, so a noisy machine (steal time) does not pass for a library fault.
NOISE_FACTOR = 2


#: How early a body may read the store's clock against its admitted start: the worker maps
#: the start onto its clock within half a round trip to the store.
MAPPING_SLACK_US = 3_000
#: A body this late after its admitted start was mapped with the wrong clock (the faked
#: worker is 7 s ahead), not run late by a loaded machine.
MAPPED_LATE_S = 2.0


def allowed_late_starts(
    pool: Pool, records: list[dict[str, Any]], interval_s: float, *, one_host_clock: bool = True
) -> tuple[float, str]:
    """How many starts may come late (quiet-machine share plus the noise measured meanwhile),
    and a line saying what the probe saw."""
    if one_host_clock:
        since_ns, until_ns = min(r["mono_ns"] for r in records), max(r["mono_ns"] for r in records)
    else:  # a faked worker's monotonic clock is not the probe's: take the probe's whole run
        since_ns, until_ns = 0, 2**63
    late, waits = pool.wake_noise(since_ns, until_ns, late_us(interval_s))
    share = late / waits if waits else 0.0
    allowed = ((1 - BODY_FLOOR_SHARE) + NOISE_FACTOR * share) * len(records)
    noise = f"the probe woke >{late_us(interval_s)}us late in {late} of {waits} waits"
    return allowed, f"{allowed:.1f} allowed; {noise}"


def assert_deadlines(records: list[dict[str, Any]], interval_s: float) -> None:
    """The start deadlines handed to pool processes, on this host's monotonic clock: those of
    one worker clear the floor, but for what its estimate of the store clock's offset moved
    between the two (a round trip shorter than the best before it gives a new estimate; on a
    loaded machine they differ by ms). Across workers each maps the store's clock to within one
    round trip to the store, which a loaded machine stretches to tens of ms, so their gaps are
    printed (the store's own gaps are asserted exactly on the ledger; a worker's mapping on a
    faked clock, by ``assert_body_gaps``)."""
    by_worker: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in records:
        by_worker[r.get("host", "")].append((r["deadline_ns"], r.get("offset_ns") or 0))
    floor_ns = body_floor_us(interval_s) * 1000
    own, short = [], []
    for starts in by_worker.values():
        for (a_ns, a_off), (b_ns, b_off) in itertools.pairwise(sorted(starts)):
            own.append((b_ns - a_ns) // 1000)
            if b_ns - a_ns < floor_ns - abs(b_off - a_off):
                short.append((b_ns - a_ns) // 1000)
    assert not short, f"one worker's deadlines {short} us apart, past its clock estimate's moves"
    every = [
        b - a for a, b in itertools.pairwise(sorted(r["deadline_ns"] // 1000 for r in records))
    ]
    print(f"DEADLINE GAPS min {min(every)}us across workers, {min(own, default=0)}us on one")


def assert_body_gaps(
    pool: Pool, records: list[dict[str, Any]], interval_s: float, *, one_host_clock: bool = True
) -> None:
    """Deadlines and body starts on this host's monotonic clock, or (``one_host_clock=False``:
    a worker's clocks are faked) body starts on the store's. What the library hands out is
    exact: every deadline clears the floor and no body starts before its deadline (with
    faked clocks: no body reads the store's clock before its admitted start, less the clock
    mapping's error, nor a whole ``MAPPED_LATE_S`` after it, as a start mapped with the wrong
    clock would). How late the OS then runs a body depends on the machine's load: printed
    beside the probe's noise, not asserted."""
    if one_host_clock:
        assert_deadlines(records, interval_s)
        early = [r for r in records if r["mono_ns"] < r["deadline_ns"]]
        assert not early, f"bodies started before their deadlines: {early[:3]}"
        body_gaps = gaps_us(records)
        late = sorted((r["mono_ns"] - r["deadline_ns"]) // 1000 for r in records)
        p50_us, p90_us = late[len(late) // 2], late[len(late) * 9 // 10]
        print(f"BODY LATENESS p50 {p50_us}us p90 {p90_us}us max {late[-1]}us after the deadlines")
    else:
        times = sorted(r["us"] for r in records)
        body_gaps = [b - a for a, b in itertools.pairwise(times)]
        off = [
            r
            for r in records
            if not -MAPPING_SLACK_US <= r["us"] - r["su"] <= round(MAPPED_LATE_S * 1e6)
        ]
        assert not off, f"bodies far from their admitted starts: {off[:3]}"
    too_close = [g for g in body_gaps if g < body_floor_us(interval_s)]
    _allowed, noise = allowed_late_starts(pool, records, interval_s, one_host_clock=one_host_clock)
    print(f"BODY GAPS {len(too_close)} of {len(body_gaps)} below the floor; {noise}")


def assert_spacing(
    pool: Pool, records: list[dict[str, Any]], interval_s: float, *, one_host_clock: bool = True
) -> None:
    """Claims exact on the store clock; body starts as ``assert_body_gaps`` checks them."""
    assert_body_gaps(pool, records, interval_s, one_host_clock=one_host_clock)
    claims = claim_times_us(pool)
    assert len(claims) >= len(records), f"{len(claims)} OK claims in the ledger"
    claim_gaps = [b - a for a, b in itertools.pairwise(claims)]
    assert min(claim_gaps) >= round(interval_s * 1e6), f"claim gap {min(claim_gaps)}us"


def assert_ticket_order(pool: Pool, records: list[dict[str, Any]], interval_s: float) -> None:
    """Start deadlines follow ticket order exactly. A body starts after a later ticket's only
    when the OS ran it a whole gap late: printed beside the probe's noise, not asserted."""
    by_deadline = [r["ticket"] for r in sorted(records, key=lambda r: r["deadline_ns"])]
    assert by_deadline == sorted(by_deadline), f"deadlines are not in ticket order: {by_deadline}"
    by_start = [r["ticket"] for r in sorted(records, key=lambda r: r["mono_ns"])]
    passed = [b for a, b in itertools.pairwise(by_start) if b < a]
    _allowed, noise = allowed_late_starts(pool, records, interval_s)
    print(f"TICKETS {passed} started after later ones ({noise})")


def assert_exactly_once(records: list[dict[str, Any]], ids: list[str]) -> None:
    seen = [r["id"] for r in records]
    assert sorted(seen) == sorted(ids), (
        f"missing={set(ids) - set(seen)} doubled={[i for i in set(seen) if seen.count(i) > 1]}"
    )


def utilization(records: list[dict[str, Any]], interval_s: float) -> float:
    """How full the span of the starts the store admitted (the records' deadlines) was with
    one per interval: a slot that went unused lowers it; a body the OS ran late does not (how
    late bodies run is ``assert_body_gaps``'s)."""
    times = sorted(r["deadline_ns"] for r in records)
    return (len(times) - 1) * interval_s * 1e9 / (times[-1] - times[0])


def assert_claims_spaced(pool: Pool, interval_s: float) -> list[int]:
    """Every OK claim's start, on the store's clock, at least one interval after the previous."""
    claims = claim_times_us(pool)
    gaps = [b - a for a, b in itertools.pairwise(claims)]
    assert min(gaps) >= round(interval_s * 1e6), f"claim gap {min(gaps)}us"
    return gaps


def missed_admissions(entries: list[dict[str, str]]) -> set[int]:
    """Indexes of the admitted starts (``claim:OK``, not a re-claim ``again``) that did not
    happen: a later admission of the same holder replaced it (a readmit), or the holder's last
    claim of the copy was answered other than OK (``claim:PAUSED`` once the queue paused, say:
    a holder that claims again has not run the task, and runs it only after an OK, again or a
    readmit). The copy may then run under another holder (its message redelivered after a
    broker outage): still one run. Looser than the audit's rule (``cube.duplicate_cells``
    reads ``missed=1``, written only while the holder's lease is live): any later claim other
    than OK counts, since a holder that claims has not run the task."""
    admission: dict[tuple[str, str, str], int] = {}
    last_ok: dict[tuple[str, str, str], bool] = {}
    missed: set[int] = set()
    for i, e in enumerate(entries):
        if not e["op"].startswith("claim:"):
            continue
        copy = (e.get("task", ""), e.get("r", ""), e.get("holder", ""))
        last_ok[copy] = e["op"] == "claim:OK"
        if e["op"] == "claim:OK" and "again" not in e:
            if copy in admission:
                missed.add(admission[copy])
            admission[copy] = i
    missed.update(i for copy, i in admission.items() if not last_ok[copy])
    return missed


def assert_one_ok_claim_each(
    pool: Pool, ids: list[str], *, twice: str = "", in_flight: frozenset[str] = frozenset()
) -> set[str]:
    """The store admitted each task once (``twice``: a task whose first claimant died; any of
    ``in_flight``: a task its worker released as its channel closed). Returns those admitted
    twice. An admission its holder claimed again past its start never happened
    (``missed_admissions``): a ``readmit`` (the same holder's new start after its admitted one
    passed unused: a lost reply, or a pool process that reached the task too late) is not a
    second run; nor is an admission whose holder's later claim of it met the done mark
    (``claim:DUPLICATE``: its process learned the task ran elsewhere, and dropped it)."""
    entries = ledger(pool)
    missed = missed_admissions(entries)
    oks = Counter(
        e["task"]
        for i, e in enumerate(entries)
        if e["op"] == "claim:OK" and "again" not in e and i not in missed
    )
    assert sorted(oks) == sorted(ids), f"missing {set(ids) - set(oks)}"
    doubled = {t: n for t, n in oks.items() if n != 1}
    allowed = {t: 2 for t in doubled if t in in_flight}
    if twice:
        allowed[twice] = 2
    # On failure, the doubled tasks' own ledger entries say which path admitted them again.
    history = [e for e in entries if e.get("task") in doubled and e.get("task") not in allowed]
    assert set(doubled) <= set(allowed) and all(n == 2 for n in doubled.values()), history
    assert not twice or twice in doubled, f"{twice}: its dead claimant's claim is not in the ledger"
    return set(doubled)


def assert_quiet(starts: list[dict[str, Any]], throttles: list[dict[str, Any]]) -> None:
    """No admitted start from a throttle's store call (and a start admitted before it, at most
    MAX_LEAD_US ahead) to its end."""
    for throttle in throttles:
        quiet_from = int(throttle["now"]) + MAX_LEAD_US
        quiet_to = int(throttle["now"]) + int(throttle["retry_after"])
        inside = [r for r in starts if quiet_from < r["us"] < quiet_to]
        assert not inside, f"starts inside the throttle {throttle}: {inside}"
