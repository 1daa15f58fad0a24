"""The soak's checker on hand-made records: each rule catches its violation; a clean run passes."""

from __future__ import annotations

from typing import Any

from tests.helpers.popped import held_at_the_end
from tests.helpers.soak_check import REMARK_NS, Events, check, describe
from tests.helpers.soak_config import Layout

LAYOUT = Layout("u")
MS = 1_000_000


def start(job: str, bucket: str, at_ms: float, **extra: Any) -> dict[str, Any]:
    at_ns = round(at_ms * MS)
    record = {"k": "start", "job": job, "task": "soak.step", "id": f"id-{job}", "r": 0}
    return {**record, "b": bucket, "host": "w1@x", "mono": at_ns + 500_000, "dl": at_ns, **extra}


def end(record: dict[str, Any], at_ms: float) -> dict[str, Any]:
    return {**record, "k": "end", "mono": round(at_ms * MS)}


def expecting(records: list[dict[str, Any]]) -> Events:
    events = Events()
    for r in records:
        if r["k"] == "start":
            events.expected.setdefault(r["job"], []).append((r["task"], r["r"]))
    return events


def spaced(bucket: str, gap_ms: float, n: int, first_ms: float = 0.0) -> list[dict[str, Any]]:
    return [start(f"{bucket}-{i}", bucket, first_ms + i * gap_ms) for i in range(n)]


def test_a_clean_run_passes() -> None:
    records = spaced(LAYOUT.main, 30, 10) + spaced(LAYOUT.capped, 20, 5)
    records += [end(r, r["dl"] / MS + 5) for r in records if r["b"] == LAYOUT.capped]
    verdict = check(records, expecting(records), LAYOUT.rule)
    assert verdict.ok, verdict
    assert verdict.ran == 15


def test_two_starts_closer_than_the_interval_are_a_violation() -> None:
    records = spaced(LAYOUT.main, 30, 5)
    records.append(start("close", LAYOUT.main, 4 * 30 + 20))  # 20 ms after the last: 30 ms needed
    verdict = check(records, expecting(records), LAYOUT.rule)
    (violation,) = verdict.violations
    assert violation["rule"] == "budget" and violation["bucket"] == LAYOUT.main
    assert "close" in describe(violation)


def test_the_budget_is_judged_on_the_store_s_starts_not_this_host_s_deadlines() -> None:
    """A deadline mapped late on a loaded host (the next one 20 ms after it, 30 needed) is no
    violation when the store admitted the two 30 ms apart; the store's own starts are."""
    mapped = spaced(LAYOUT.main, 30, 3)
    mapped[1]["dl"] += 10 * MS
    for i, record in enumerate(mapped):
        record["su"] = 5_000_000 + i * 30_000
    assert check(mapped, expecting(mapped), LAYOUT.rule).ok
    mapped[2]["su"] -= 10_000
    (violation,) = check(mapped, expecting(mapped), LAYOUT.rule).violations
    assert violation["rule"] == "budget" and "su=5050000" in describe(violation)


def test_a_burst_and_costs_beyond_the_budget_break_it() -> None:
    bucket = f"{LAYOUT.tenants}:acme"  # burst 3, 75 ms
    within = [start("a", bucket, 0, cost=2), start("b", bucket, 0, cost=1)]
    assert check(within, expecting(within), LAYOUT.rule).ok
    over = [*within, start("c", bucket, 1, cost=1)]
    verdict = check(over, expecting(over), LAYOUT.rule)
    assert [v["bucket"] for v in verdict.violations] == [bucket, f"{LAYOUT.tenants} (outer)"]


def test_tenants_together_keep_their_outer_bucket() -> None:
    """Each tenant alone is fine; four together at once overdraw the outer's burst of 3."""
    records = [start(f"k{i}", f"{LAYOUT.tenants}:k{i}", 0) for i in range(4)]
    verdict = check(records, expecting(records), LAYOUT.rule)
    assert [v["bucket"] for v in verdict.violations] == [f"{LAYOUT.tenants} (outer)"]


def test_an_extra_limit_is_checked_beside_the_interval() -> None:
    """The limited bucket: 50 ms interval, but 8/s: 9 starts 50 ms apart break the 8/s."""
    records = spaced(LAYOUT.limited, 50, 3)
    verdict = check(records, expecting(records), LAYOUT.rule)
    assert [v["what"] for v in verdict.violations] == ["limit 125000us/1"] * 2


def test_more_bodies_than_the_cap() -> None:
    records = spaced(LAYOUT.capped, 20, 3)
    records += [end(r, 100) for r in records]
    verdict = check(records, expecting(records), LAYOUT.rule)
    assert [v["rule"] for v in verdict.violations] == ["cap"]


def test_a_killed_workers_body_ends_at_its_kill() -> None:
    records = spaced(LAYOUT.capped, 20, 3)
    events = expecting(records)
    events.kills = [("w1@x", 30 * MS)]  # the first two bodies die at 30 ms; the third at 40 ms
    assert check(records, events, LAYOUT.rule).ok


def test_a_start_inside_a_pause_or_a_throttle() -> None:
    records = spaced(LAYOUT.main, 100, 6)
    events = expecting(records)
    events.pauses = [(LAYOUT.main, 150 * MS, 250 * MS)]  # the start at 200 ms is inside
    events.throttles = [(LAYOUT.main, 390 * MS, 100 * MS)]  # 400 ms is MAX_LEAD ahead: allowed
    verdict = check(records, events, LAYOUT.rule)
    assert [(v["rule"], v["window"][0]["job"]) for v in verdict.violations] == [
        ("pause", f"{LAYOUT.main}-2")
    ]
    events.throttles = [(LAYOUT.main, 350 * MS, 100 * MS)]
    assert [v["rule"] for v in check(records, events, LAYOUT.rule).violations] == [
        "pause",
        "throttle",
    ]


def test_a_pause_is_not_promised_after_the_store_lost_it() -> None:
    records = spaced(LAYOUT.main, 100, 6)
    events = expecting(records)
    events.pauses = [(LAYOUT.main, 150 * MS, 450 * MS)]
    events.losses = [180 * MS]
    assert check(records, events, LAYOUT.rule).ok


def test_a_throttle_is_not_promised_after_the_store_lost_it() -> None:
    records = spaced(LAYOUT.main, 100, 6)
    events = expecting(records)
    events.throttles = [(LAYOUT.main, 150 * MS, 300 * MS)]
    assert {v["rule"] for v in check(records, events, LAYOUT.rule).violations} == {"throttle"}
    events.losses = [180 * MS]  # its wait went with the store's state
    assert check(records, events, LAYOUT.rule).ok


def test_set_interval_is_held_while_in_force() -> None:
    records = spaced(LAYOUT.main, 40, 6)
    events = expecting(records)
    events.overrides = [(LAYOUT.main, 100 * MS, 300 * MS, 60_000)]
    assert {v["rule"] for v in check(records, events, LAYOUT.rule).violations} == {"override"}
    events.losses = [110 * MS]  # the override was lost with the store's state
    assert check(records, events, LAYOUT.rule).ok


def test_an_override_holds_starts_by_when_the_store_admitted_them() -> None:
    """A re-claimed start keeps its missed deadline (inside the override) but was admitted
    after the unset, 30 ms after the previous start: not a violation. The same start admitted
    inside the window is one."""
    wall_offset_ns = 5_000 * MS  # the store's clock reads this far ahead of this host's
    first = start("a", LAYOUT.main, 250, su=(250 * MS + wall_offset_ns) // 1000)
    reclaimed = start("b", LAYOUT.main, 120, su=(280 * MS + wall_offset_ns) // 1000)
    records = [first, reclaimed]
    events = expecting(records)
    events.wall_offset_ns = wall_offset_ns
    events.overrides = [(LAYOUT.main, 100 * MS, 260 * MS, 60_000)]
    assert check(records, events, LAYOUT.rule).ok
    events.overrides = [(LAYOUT.main, 100 * MS, 300 * MS, 60_000)]
    assert {v["rule"] for v in check(records, events, LAYOUT.rule).violations} == {"override"}


def test_lost_doubled_revoked_and_excused() -> None:
    records = spaced(LAYOUT.main, 30, 3)
    events = expecting(records)
    events.expected.update({"gone": [("soak.step", 0)], "revoked": [("soak.step", 0)]})
    events.revoked.add("revoked")
    records.append(start(f"{LAYOUT.main}-0", LAYOUT.main, 500))
    verdict = check(records, events, LAYOUT.rule)
    assert verdict.lost == ["gone soak.step retries=0: never ran"]
    assert verdict.doubled == [f"{LAYOUT.main}-0 soak.step retries=0: ran 2 times"]
    assert verdict.revoked == 1
    events.ids["gone"] = "id-gone"
    events.excused_ids.add("id-gone")
    assert check(records, events, LAYOUT.rule).lost == []
    events.expected["gone/r"] = [("soak.step", 0)]  # its replacement, never sent
    assert check(records, events, LAYOUT.rule).lost == []


def test_a_message_no_worker_received_is_popped_once_per_kill_on_redis() -> None:
    """A first step no worker received is a pop lost on a Redis broker, at most as many as the
    run allows (one per kill here); a second one, a retry step, or any on RabbitMQ is lost."""
    records = spaced(LAYOUT.main, 30, 2)
    events = expecting(records)
    events.expected.update({"a": [("soak.step", 0)], "b": [("soak.step", 0), ("soak.step", 1)]})
    events.ids.update({"a": "id-a", "b": "id-b"})
    events.received = {"id-b"}
    events.kills = [("w1@x", 10 * MS)]
    events.pops = len(events.kills)
    events.expected["a"].append(("soak.step", 1))  # a retry that never existed
    verdict = check(records, events, LAYOUT.rule)
    assert verdict.popped == ["a soak.step retries=0: never received"]
    assert verdict.excused == 1
    assert len(verdict.lost) == 2  # b was received: both its steps are lost
    events.received.discard("id-b")
    verdict = check(records, events, LAYOUT.rule)
    assert verdict.popped == [] and len(verdict.lost) == 4  # both jobs, both steps each
    events.pops = 0
    events.received.add("id-b")
    assert check(records, events, LAYOUT.rule).popped == []


def test_a_retry_whose_message_no_worker_took_a_ticket_for_is_popped_on_redis() -> None:
    """A retry sent by a body that ended, which the ledger never names: its message died in
    a pop (its id was received before, as the first step). Named in the ledger, or its
    previous step never ran, it is lost; beyond the pops allowed, too."""
    first = {**start("j", LAYOUT.main, 0), "id": "id-j"}
    records = [first, end(first, 5)]
    events = Events(expected={"j": [("soak.step", 0), ("soak.step", 1), ("soak.step", 2)]})
    events.ids["j"] = "id-j"
    events.received = {"id-j"}
    events.kills = [("w2@x", 10 * MS)]
    events.pops = 1
    verdict = check(records, events, LAYOUT.rule)
    assert verdict.popped == ["j soak.step retries=1: never received"]
    assert verdict.excused == 1 and verdict.ok  # step 2 never existed
    events.in_ledger = {("id-j", 1)}
    verdict = check(records, events, LAYOUT.rule)
    assert verdict.popped == [] and len(verdict.lost) == 2
    events.in_ledger = set()
    events.pops = 0
    assert len(check(records, events, LAYOUT.rule).lost) == 2


def test_a_throttled_copy_no_worker_took_a_ticket_for_is_popped_after_a_kill() -> None:
    """A throttled run's copy sent again, whose last ledger entry is the throttle, with a
    worker killed just after (it popped the copy): popped. Without the kill near, or with a
    ticket for the copy in the ledger, it is lost."""
    first = {**start("h", LAYOUT.throttled, 0), "id": "id-h", "task": "soak.call_api"}
    throttled = {**first, "k": "throttled", "mono": 10 * MS}
    records = [first, throttled]
    events = Events(expected={"h": [("soak.call_api", 0)]}, ids={"h": "id-h"})
    events.received = {"id-h"}
    events.pops = 1
    events.resent_unseen = {("id-h", 0)}
    events.kills = [("w3@x", 30 * MS)]
    verdict = check(records, events, LAYOUT.rule)
    assert verdict.popped == ["h soak.call_api retries=0: never received"] and verdict.ok
    events.kills = [("w3@x", 3_000 * MS)]
    assert check(records, events, LAYOUT.rule).lost == ["h soak.call_api retries=0: never ran"]
    events.kills = [("w3@x", 30 * MS)]
    events.resent_unseen = set()
    assert len(check(records, events, LAYOUT.rule).lost) == 1


def test_a_retry_chain_cut_by_a_kill_mid_body_is_excused() -> None:
    first = start("j", LAYOUT.main, 0)
    events = Events(expected={"j": [("soak.step", 0), ("soak.step", 1)]})
    events.kills = [("w1@x", 10 * MS)]
    verdict = check([first], events, LAYOUT.rule)
    assert verdict.ok and verdict.excused == 1
    events.kills = []
    assert check([first], events, LAYOUT.rule).lost == ["j soak.step retries=1: never ran"]


def test_a_throttled_run_killed_before_its_copy_went_out_is_excused() -> None:
    """Throttled, then its worker killed before it sent the copy that runs it again: Celery's
    early-acked retry is lost the same way. Without the kill it is lost."""
    first = start("h", LAYOUT.throttled, 0)
    throttled = {**first, "k": "throttled", "mono": 5 * MS}
    events = expecting([first])
    events.kills = [("w1@x", 10 * MS)]
    verdict = check([first, throttled], events, LAYOUT.rule)
    assert verdict.ok and verdict.excused == 1
    events.kills = []
    assert check([first, throttled], events, LAYOUT.rule).lost == [
        "h soak.step retries=0: never ran"
    ]


def test_a_throttled_start_is_not_a_run() -> None:
    first = start("h", LAYOUT.throttled, 0)
    again = start("h", LAYOUT.throttled, 1000)
    throttled = {**first, "k": "throttled"}
    verdict = check([first, throttled, again], expecting([first]), LAYOUT.rule)
    assert verdict.ok and verdict.ran == 1


def test_a_body_its_worker_and_the_store_both_forgot_is_beyond_the_promise() -> None:
    """Doubled across a state loss is a failure while the first body's worker lived; its
    worker killed, then the state lost, before the second run, it is counted apart."""
    first = start("a", LAYOUT.main, 0)
    after = {**start("a", LAYOUT.main, 9000), "host": "w2@x"}
    records = [first, end(first, 5), after, end(after, 9005)]
    events = expecting([first])
    events.losses, events.returns = [500 * MS], [600 * MS]
    verdict = check(records, events, LAYOUT.rule)
    assert len(verdict.doubled) == 1 and not verdict.forgotten, "its worker remembered it"
    events.kills = [("w1@x", 600 * MS + REMARK_NS + 1)]
    assert len(check(records, events, LAYOUT.rule).doubled) == 1, "killed after its mark went"
    events.kills = [("w1@x", 400 * MS)]
    verdict = check(records, events, LAYOUT.rule)
    assert not verdict.doubled and len(verdict.forgotten) == 1 and verdict.ok


def test_a_forgotten_run_after_a_throttled_start_is_beyond_the_promise() -> None:
    """The step's first start was throttled on w1 (its copy went again); its first run was on
    w2, killed, then the state lost, before the second run on w3: judged on w2's run."""
    throttled_start = start("h", LAYOUT.throttled, 0)
    throttled = {**throttled_start, "k": "throttled", "mono": 30 * MS}
    first = {**start("h", LAYOUT.throttled, 1000), "host": "w2@x"}
    after = {**start("h", LAYOUT.throttled, 3000), "host": "w3@x"}
    records = [throttled_start, throttled, first, end(first, 1005), after, end(after, 3005)]
    events = expecting([throttled_start])
    events.losses = [2500 * MS]
    events.kills = [("w1@x", 500 * MS)]
    assert len(check(records, events, LAYOUT.rule).doubled) == 1, "the run's worker lived"
    events.kills = [("w2@x", 2000 * MS)]
    verdict = check(records, events, LAYOUT.rule)
    assert not verdict.doubled and len(verdict.forgotten) == 1 and verdict.ok


def test_each_run_of_a_forgotten_step_sends_its_own_retry() -> None:
    """A retried step that ran twice beyond the promise sent its retry twice, each a message of
    its own that ran once: beyond the promise too, down the chain. A retry that ran more times
    than the step before it is doubled."""
    first = {**start("m", LAYOUT.main, 0), "host": "w1@x"}
    second = {**start("m", LAYOUT.main, 9000), "host": "w2@x"}
    retries = [
        {**start("m", LAYOUT.main, at_ms), "r": 1, "host": host}
        for at_ms, host in ((1000, "w3@x"), (9500, "w2@x"))
    ]
    records = [first, end(first, 5), second, end(second, 9005)]
    records += [r for retry in retries for r in (retry, end(retry, retry["mono"] / MS + 1))]
    events = Events(expected={"m": [("soak.step", 0), ("soak.step", 1)]})
    events.losses, events.returns = [2000 * MS], [2100 * MS]
    events.kills = [("w1@x", 1500 * MS)]
    verdict = check(records, events, LAYOUT.rule)
    assert not verdict.doubled and len(verdict.forgotten) == 2 and verdict.ok, verdict
    third = {**retries[0], "mono": 9800 * MS, "dl": 9800 * MS, "host": "w3@x"}
    verdict = check([*records, third, end(third, 9801)], events, LAYOUT.rule)
    assert [d.split(" (")[0] for d in verdict.doubled] == ["m soak.step retries=1: ran 3 times"]
    events.kills = []
    verdict = check(records, events, LAYOUT.rule)
    assert len(verdict.doubled) == 2 and not verdict.forgotten, "no run was forgotten"


def test_each_run_of_a_forgotten_replacer_sends_its_own_replacement() -> None:
    """A replacer that ran twice beyond the promise sent two replacements (job ``<job>/r``),
    each of which ran once: beyond the promise too."""
    first = {**start("m", LAYOUT.main, 0), "task": "soak.replacer"}
    second = {**start("m", LAYOUT.main, 9000), "task": "soak.replacer", "host": "w2@x"}
    replacements = [
        {**start("m/r", LAYOUT.main, at_ms), "host": host}
        for at_ms, host in ((1000, "w3@x"), (9500, "w2@x"))
    ]
    records = [first, end(first, 5), second, end(second, 9005)]
    records += [r for rep in replacements for r in (rep, end(rep, rep["mono"] / MS + 1))]
    events = Events(expected={"m": [("soak.replacer", 0)], "m/r": [("soak.step", 0)]})
    events.losses, events.returns = [2000 * MS], [2100 * MS]
    events.kills = [("w1@x", 1500 * MS)]
    verdict = check(records, events, LAYOUT.rule)
    assert not verdict.doubled and len(verdict.forgotten) == 2 and verdict.ok, verdict
    events.kills = []
    assert len(check(records, events, LAYOUT.rule).doubled) == 2, "no run was forgotten"


def test_a_run_whose_worker_died_before_writing_its_mark_again_is_beyond_the_promise() -> None:
    """The other way round: the store lost its state after the first run began, came back,
    and the run's worker was killed before its next read of the birth (``REMARK_NS``): nothing
    remembered the run. Killed later, the worker had written the mark again: doubled."""
    first = start("h", LAYOUT.throttled, 1000)
    again = {**start("h", LAYOUT.throttled, 9000), "host": "w3@x"}
    records = [first, end(first, 1005), again, end(again, 9005)]
    events = expecting([first])
    events.losses, events.returns = [1500 * MS], [2000 * MS]
    events.kills = [(first["host"], 2000 * MS + REMARK_NS)]
    verdict = check(records, events, LAYOUT.rule)
    assert not verdict.doubled and len(verdict.forgotten) == 1 and verdict.ok
    events.kills = [(first["host"], 2000 * MS + REMARK_NS + 1)]
    assert len(check(records, events, LAYOUT.rule).doubled) == 1


def test_a_capped_task_that_ran_twice_has_two_bodies_not_one_long_one() -> None:
    """Each start ends at the end its own worker recorded after it."""
    first = start("c", LAYOUT.capped, 0)
    again = {**start("c", LAYOUT.capped, 5000), "host": "w2@x"}
    between = spaced(LAYOUT.capped, 20, 2, first_ms=1000)
    records = [first, end(first, 10), again, end(again, 5010), *between]
    records += [end(r, r["dl"] / MS + 5) for r in between]
    verdict = check(records, expecting([first, *between]), LAYOUT.rule)
    assert not verdict.violations and len(verdict.doubled) == 1


def test_a_message_back_in_the_broker_counts_as_not_in_a_workers_hands() -> None:
    """Received, then back in the broker with the worker's lost connection (its DEBUG trail):
    a worker killed as it popped it again takes it unseen, so it is not counted as received;
    received again later, it is."""
    a, b = "0" * 8 + "-0000-0000-0000-" + "0" * 12, "1" * 8 + "-1111-1111-1111-" + "1" * 12
    log = (
        f"[x: INFO/MainProcess] Task soak.capped[{a}] received\n"
        f"[x: INFO/MainProcess] Task soak.capped[{b}] received\n"
        f"[x: DEBUG/MainProcess] interval: connection lost, held 2: {a} {b}\n"
    )
    assert held_at_the_end({"x": log}) == set()
    again = f"[y: INFO/MainProcess] Task soak.capped[{b}] received\n"
    assert held_at_the_end({"x": log, "y": again}) == {b}
    assert held_at_the_end({"x": log + again}) == {b}


def test_a_killed_workers_messages_count_as_back_in_the_broker() -> None:
    """A killed worker's unacknowledged messages go back after the visibility timeout, where
    a worker killed as it pops one takes it unseen: not counted as received."""
    a = "0" * 8 + "-0000-0000-0000-" + "0" * 12
    log = f"[x: INFO/MainProcess] Task soak.capped[{a}] received\n"
    assert held_at_the_end({"x": log}, killed={"x"}) == set()
    assert held_at_the_end({"x": log, "y": log}, killed={"x"}) == {a}


def test_the_soak_waits_while_records_keep_coming_however_slow_its_check() -> None:
    """A check slower than the idle limit (a loaded machine) does not end the wait while the
    record keeps growing; once it stops growing for the idle limit, the wait ends."""
    from types import SimpleNamespace

    from tests.helpers import soak_run

    clock = [0.0]
    counts = iter([*range(1, 8), 7, 7, 7, 7, 7])
    soak: Any = object.__new__(soak_run.Soak)
    soak.store = SimpleNamespace(resume=lambda: None, alive=True)
    soak.broker = SimpleNamespace(up=lambda: None)
    soak.link = SimpleNamespace(fast=lambda: None)
    soak.workers, soak.undos = [], []
    soak.recorder = SimpleNamespace(llen=lambda _key: next(counts))
    soak._watch_workers = lambda: None
    checks: list[float] = []

    def slow_check() -> Any:
        checks.append(clock[0])
        clock[0] += 40.0  # longer than idle_s
        return SimpleNamespace(lost=["m1.0 never ran"])

    soak._check = slow_check
    saved = soak_run.time.monotonic, soak_run.time.sleep
    soak_run.time.monotonic = lambda: clock[0]  # type: ignore[assignment]
    soak_run.time.sleep = lambda s: clock.__setitem__(0, clock[0] + s)  # type: ignore[assignment]
    try:
        soak._settle(idle_s=30.0, timeout_s=10_000.0)
    finally:
        soak_run.time.monotonic, soak_run.time.sleep = saved
    assert len(checks) == 7, "checked at each growing count; ended at the first unchanged one"


def test_the_ledger_names_messages_by_their_retries_not_their_send_code() -> None:
    """A ledger entry's ``r`` carries its send's code above the retries; the bodies' records
    carry only the retries: a throttled task's copy no worker took a ticket for is found by
    (task id, retries), as the checker looks it up."""
    from celery_interval.placement import SEND_SHIFT
    from tests.helpers.soak_ledger import in_ledger, resent_unseen

    r = str((834546636 << SEND_SHIFT) | 0)
    ledger = {
        ("q", b"1-0"): {"op": "claim:OK", "task": "h", "r": r},
        ("q", b"2-0"): {"op": "throttle", "task": "h", "r": r},
        ("q", b"3-0"): {"op": "throttle", "task": "k", "r": r},
        ("q", b"4-0"): {"op": "grant:OK", "task": "k", "r": r},
    }
    assert resent_unseen(ledger) == {("h", 0)}
    assert in_ledger(ledger) == {("h", 0), ("k", 0)}
