"""The soak's checker: pure functions from the independent record and the run's events to the
lost, doubled and violating windows (every time on the host's CLOCK_MONOTONIC, ns).

The rules, and which promise each checks:

- **once**: each step of a job (a task name and its ``retries``) has exactly one start that
  was not throttled. A revoked job may have none; a job whose send raised may have none. A
  step missing after an earlier step began on a worker killed before that body ended (its
  end is recorded once its retry or replacement went) is excused, as is a throttled step
  whose worker was killed before it sent its copy again (Celery runs an early-acked task at
  most once); so is a task the store admitted to a
  worker as it died whose copy was dropped as a duplicate (``excused_ids``, from the ledger),
  and its replacement (``<job>/r``, the same task id), which that body may not have sent.
  On a Redis broker a first step that no worker's log ever received is counted apart
  (``popped``): the one message a worker had popped as it was killed, or as the broker died
  (``tests/helpers/popped.py``); so is a retry step whose earlier step ended and which the
  store's ledger never names, and a throttled step whose last ledger entry is its throttle
  (no worker took a ticket for the copy sent again: it died in a pop, its id received
  before); more than one per kill, and one per worker per broker death, is a loss.
  A step that ran twice is *forgotten* (beyond the promise, counted apart) when nothing
  remembered its first run: its worker killed and the store's state lost, in either order,
  before the second; each of those runs sends the next step, which may then run once per run
  of the step before it.
- **budget** (P5, bursts, costs, extra limits, the outer bucket): the starts the workers
  handed their bodies, on the store's clock (``su``: the admitted start, so no mapping to this
  host's clock and no machine load enters), fed in order to the store's GCRA rule with the
  interval configured, or with any extra limit; each start may come ``slack_us`` early. A
  tenant's starts also feed its outer bucket's budget. Checked across state loss (the store
  promises it).
- **override**: while ``set_interval`` is in force and the store kept its state since, two
  consecutive starts are the longer interval apart on the store's clock (less the slack); a
  start is in the window by when the store admitted it (``su``, mapped to this host's clock
  with ``wall_offset_ns``), not by its deadline, which a re-claimed start leaves behind.
- **cap** (P10): at no instant more bodies of the capped bucket between their recorded start
  and end than the cap; a killed worker's body ends at its kill.
- **pause** (P3): no deadline from the pause's return plus ``MAX_LEAD_US`` to the unpause
  (each end narrowed by ``CLOCKS_SLACK_NS``), nor after a state loss inside it (a pause is
  state in the store).
- **throttle** (P9): no deadline from a throttle's store time plus ``MAX_LEAD_US`` to its end
  (narrowed the same), nor after a state loss inside it (a throttle's wait is state in the
  store); the throttles are the store's ledger entries.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from celery_interval.worker.store.births import LOOK_S
from tests.helpers.soak_config import Rule

MAX_LEAD_NS = 20_000_000
#: A throttled run's copy goes to the broker as the run ends: a worker killed this soon after
#: may have popped it.
RESENT_POP_NS = 2_000_000_000
#: A worker alive when the store comes back without its state writes its remembered marks
#: again within one read of the store's birth (every ``LOOK_S``); twice that for a loaded host.
REMARK_NS = round(2 * LOOK_S * 1e9)
#: How far a store-clock time may be off once mapped to this host's monotonic clock.
CLOCKS_SLACK_NS = 3_000_000

Record = dict[str, Any]


def slack_us(interval_us: int) -> int:
    """How early a start deadline may come against the store's admitted start."""
    return max(interval_us // 10, 3_000)


@dataclass
class Events:
    """What the runner did and the store said, besides the bodies' records."""

    #: job → its steps, (task name, retries) each.
    expected: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    revoked: set[str] = field(default_factory=set)
    uncertain: set[str] = field(default_factory=set)
    #: (worker name, monotonic ns just before its SIGKILL).
    kills: list[tuple[str, int]] = field(default_factory=list)
    #: job → the task id it was sent with.
    ids: dict[str, str] = field(default_factory=dict)
    #: task ids admitted to a worker as it died whose copy was dropped as a duplicate.
    excused_ids: set[str] = field(default_factory=set)
    #: task ids a worker's log says it received.
    received: set[str] = field(default_factory=set)
    #: (task id, retries) of each message the store's ledger names.
    in_ledger: set[tuple[str, int]] = field(default_factory=set)
    #: (task id, retries) whose last ledger entry is a throttle: no ticket for the copy sent
    #: again.
    resent_unseen: set[tuple[str, int]] = field(default_factory=set)
    #: how many popped messages may be lost (a Redis broker): one per killed worker, and one
    #: per worker at each broker death (the pop's reply dies with the broker); 0 elsewhere.
    pops: int = 0
    #: monotonic ns of each store restart that lost its state ...
    losses: list[int] = field(default_factory=list)
    #: ... and of each such store's return (it answered again), in the same order.
    returns: list[int] = field(default_factory=list)
    #: (bucket, from ns, to ns) of each pause in force.
    pauses: list[tuple[str, int, int]] = field(default_factory=list)
    #: (bucket, from ns, to ns, interval µs) of each set_interval in force.
    overrides: list[tuple[str, int, int, int]] = field(default_factory=list)
    #: (bucket, store time ns, retry_after ns) of each throttle in the ledger.
    throttles: list[tuple[str, int, int]] = field(default_factory=list)
    #: The store's wall clock (ns) less this host's monotonic one, as the run measured it.
    wall_offset_ns: int = 0


@dataclass
class Verdict:
    steps: int = 0
    ran: int = 0
    revoked: int = 0
    excused: int = 0
    lost: list[str] = field(default_factory=list)
    #: first steps no worker received, at most one per killed worker (a Redis broker's pop).
    popped: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)
    #: steps that ran twice beyond the promise (P4): the worker their first body ran on was
    #: killed, and then the store lost its state, before the second began; nothing that
    #: remembered the body was left.
    forgotten: list[str] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.doubled or self.violations)


def deadline(record: Record) -> int:
    """A start's deadline (its body's time where the worker handed none)."""
    return int(record.get("dl") or record["mono"])


def store_start_us(record: Record) -> int:
    """A start as the store admitted it (µs, its clock); a record without one (no claim
    named it) on this host's clock instead, which ``by_store_start`` never mixes with it."""
    return int(record["su"]) if record.get("su") is not None else deadline(record) // 1000


def by_store_start(starts: list[Record]) -> list[Record]:
    """``starts`` ordered on the store's clock, or on this host's if one has no store start."""
    if all(r.get("su") is not None for r in starts):
        return sorted(starts, key=store_start_us)
    return [{**r, "su": None} for r in sorted(starts, key=deadline)]


def admitted_ns(record: Record, wall_offset_ns: int) -> int:
    """When the store admitted a start, on this host's monotonic clock (its deadline where the
    record names no store start)."""
    su = record.get("su")
    return int(su) * 1000 - wall_offset_ns if su is not None else deadline(record)


def starts_of(records: Iterable[Record]) -> list[Record]:
    return sorted((r for r in records if r["k"] == "start"), key=deadline)


def check(records: list[Record], events: Events, rule_of: Callable[[str], Rule]) -> Verdict:
    verdict = Verdict()
    check_once(records, events, verdict)
    starts = starts_of(records)
    by_bucket: dict[str, list[Record]] = defaultdict(list)
    for record in starts:
        by_bucket[record["b"]].append(record)
    outers: dict[str, list[Record]] = defaultdict(list)
    for bucket, own in sorted(by_bucket.items()):
        rule = rule_of(bucket)
        verdict.violations += check_budget(bucket, own, rule)
        if rule.outer:
            outers[rule.outer] += own
        if rule.cap:
            verdict.violations += check_cap(bucket, records, rule.cap, events.kills)
    for outer, inner in sorted(outers.items()):
        both = sorted(inner + by_bucket.get(outer, []), key=deadline)
        verdict.violations += check_budget(f"{outer} (outer)", both, rule_of(outer))
    verdict.violations += check_quiet(by_bucket, events)
    verdict.violations += check_overrides(by_bucket, events)
    return verdict


def check_once(records: list[Record], events: Events, verdict: Verdict) -> None:
    ran: Counter[tuple[str, str, int]] = Counter()
    throttled: Counter[tuple[str, str, int]] = Counter()
    throttled_at: dict[tuple[str, str, int], int] = {}
    for r in records:
        key = (r["job"], r["task"], int(r["r"]))
        if r["k"] == "start":
            ran[key] += 1
        elif r["k"] == "throttled":
            throttled[key] += 1
            throttled_at[key] = max(throttled_at.get(key, 0), int(r["mono"]))
    by_job: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_job[r["job"]].append(r)
    after_pops: list[str] = []
    forgotten_last: dict[str, int] = {}  # job → its last step's runs beyond the promise
    for job, steps in sorted(events.expected.items()):  # a replacer before its "<job>/r"
        died_at = _died_mid_body(by_job[job], events.kills)
        popped = False  # a step was popped: the job's later steps never existed
        # the previous step's runs beyond the promise (a replacement's: its replacer's): each
        # sent this one
        forgotten_runs = forgotten_last.get(job.removesuffix("/r"), 0)  # a job's own: none yet
        for step, (task, retries) in enumerate(steps):
            verdict.steps += 1
            key = (job, task, retries)
            runs = ran[key] - throttled[key]
            sent_by_each, forgotten_runs = 1 < runs <= forgotten_runs, 0
            if runs > 1 and _forgotten(key, records, events):
                verdict.forgotten.append(
                    f"{job} {task} retries={retries}: ran {runs} times (its first worker "
                    "killed, then the store's state lost, before the second)"
                )
                forgotten_runs = runs
            elif sent_by_each:
                verdict.forgotten.append(
                    f"{job} {task} retries={retries}: ran {runs} times, once for each run of "
                    "the step before it"
                )
                forgotten_runs = runs
            elif runs > 1:
                verdict.doubled.append(
                    f"{job} {task} retries={retries}: ran {runs} times"
                    + _across_loss(job, task, retries, records, events.losses)
                )
            elif runs == 1:
                verdict.ran += 1
            elif job in events.revoked or job in events.uncertain:
                verdict.revoked += 1
            elif popped:
                after_pops.append(f"{job} {task} retries={retries}: never ran (popped before)")
            elif (died_at is not None and (task, retries) >= died_at) or events.ids.get(
                job.removesuffix("/r")  # a replacement has its replacer's task id
            ) in events.excused_ids:
                verdict.excused += 1
            elif events.pops and _never_reached_a_worker(
                job, retries, steps[:step], ran, events, throttled_at=throttled_at.get(key)
            ):
                verdict.popped.append(f"{job} {task} retries={retries}: never received")
                popped = True
            else:
                verdict.lost.append(f"{job} {task} retries={retries}: never ran")
        forgotten_last[job] = forgotten_runs
    if len(verdict.popped) > events.pops:
        verdict.lost += [f"{p} (more than {events.pops} popped)" for p in verdict.popped]
        verdict.lost += after_pops
        verdict.popped = []
    else:
        verdict.excused += len(after_pops)


def _never_reached_a_worker(
    job: str,
    retries: int,
    before: list[tuple[str, int]],
    ran: Counter[tuple[str, str, int]],
    events: Events,
    *,
    throttled_at: int | None = None,
) -> bool:
    """Whether the job's step ``retries`` may have died in a pop: no worker received its
    first step; or its previous step ran and the ledger names no ticket of this one; or it
    was throttled (at ``throttled_at``), a worker was killed within ``RESENT_POP_NS`` after,
    and the ledger names no ticket of the copy sent again."""
    task_id = events.ids.get(job)
    if throttled_at is not None:
        killed = any(0 <= at - throttled_at <= RESENT_POP_NS for _name, at in events.kills)
        return killed and (task_id, retries) in events.resent_unseen
    if not before:
        return task_id not in events.received
    return ran[(job, *before[-1])] > 0 and (task_id, retries) not in events.in_ledger


def _across_loss(
    job: str, task: str, retries: int, records: list[Record], losses: list[int]
) -> str:
    """Says so when a state loss came between the runs: a copy then meets no done mark."""
    times = sorted(
        r["mono"]
        for r in records
        if r["k"] == "start" and (r["job"], r["task"], r["r"]) == (job, task, retries)
    )
    if any(times[0] < t < times[-1] for t in losses):
        return " (across a store state loss: a copy of its message met no done mark)"
    return ""


def _forgotten(key: tuple[str, str, int], records: list[Record], events: Events) -> bool:
    """Whether the first run of the step ``key`` was remembered nowhere when its second began
    (a throttled start is no run: its copy went again): its worker SIGKILLed after it began,
    then a store state loss, both before the second; or the other way round, the loss after
    it began and then the kill, before the worker could write its mark again (within
    ``REMARK_NS`` of the store's return)."""
    mine = [r for r in records if (r["job"], r["task"], r["r"]) == key]
    throttled = {(r["host"], r["dl"]) for r in mine if r["k"] == "throttled"}
    runs = sorted(
        (r for r in mine if r["k"] == "start" and (r["host"], r["dl"]) not in throttled),
        key=lambda r: int(r["mono"]),
    )
    first, began_ns, second_ns = runs[0], int(runs[0]["mono"]), int(runs[1]["mono"])
    kills = [at_ns for host, at_ns in events.kills if host == first["host"]]
    for i, lost_ns in enumerate(events.losses):
        back_ns = events.returns[i] if i < len(events.returns) else lost_ns
        for killed_ns in kills:
            if began_ns <= killed_ns <= lost_ns < second_ns:
                return True
            if began_ns <= lost_ns <= killed_ns <= back_ns + REMARK_NS and killed_ns < second_ns:
                return True
    return False


def _died_mid_body(records: list[Record], kills: list[tuple[str, int]]) -> tuple[str, int] | None:
    """The last step of one job (``records``: its own) whose body began on a worker killed
    before it recorded its end (a throttled run ends when its copy is sent again, after its
    ``throttled`` record: killed before, the step is excused too, as an early-acked task's
    retry is)."""
    ends = {(r["task"], r["r"]) for r in records if r["k"] == "end"}
    died = None
    for r in records:
        if r["k"] != "start" or (r["task"], r["r"]) in ends:
            continue
        if any(host == r["host"] and at_ns >= r["mono"] for host, at_ns in kills):
            died = max(died or ("", -1), (r["task"], int(r["r"])))
    return died


def _gcra(
    tat_us: int | None, start_us: int, interval_us: int, burst: int, cost: int
) -> tuple[bool, int]:
    tat_us = start_us if tat_us is None else tat_us
    broke = tat_us - start_us > max(0, burst - cost) * interval_us + slack_us(interval_us)
    return broke, min(max(tat_us, start_us) + cost * interval_us, start_us + burst * interval_us)


def check_budget(bucket: str, starts: list[Record], rule: Rule) -> list[dict[str, Any]]:
    """The interval with its burst and costs, and each extra limit, over every window."""
    found = []
    limits = [(rule.interval_us, rule.burst, "interval")] + [
        (interval_us, burst, f"limit {interval_us}us/{burst}") for interval_us, burst in rule.limits
    ]
    starts = by_store_start(starts)
    for interval_us, burst, name in limits:
        tat: int | None = None
        for i, record in enumerate(starts):
            start_us = store_start_us(record)
            cost = int(record.get("cost") or 1)
            broke, tat = _gcra(tat, start_us, interval_us, burst, cost)
            if broke:
                window = starts[max(0, i - burst - 1) : i + 1]
                found.append(_violation("budget", bucket, name, window))
    return found


def check_cap(
    bucket: str, records: list[Record], cap: int, kills: list[tuple[str, int]]
) -> list[dict[str, Any]]:
    ends: dict[tuple[str, int, str], list[int]] = defaultdict(list)
    for r in records:
        if r["k"] == "end" and r["b"] == bucket:
            ends[(r["id"], r["r"], r["host"])].append(r["mono"])
    spans = []
    for r in records:
        if r["k"] != "start" or r["b"] != bucket:
            continue
        # a copy that ran again has its own end, after its own start, on its own worker
        later = [at for at in ends[(r["id"], r["r"], r["host"])] if at >= r["mono"]]
        killed = [at for host, at in kills if host == r["host"] and at >= r["mono"]]
        end = min(later or killed, default=None)
        if end is not None:
            spans.append((r["mono"], end, r))
    edges = sorted(
        [(s, 1, r) for s, _, r in spans] + [(e, -1, r) for _, e, r in spans],
        key=lambda x: (x[0], x[1]),
    )
    running: list[Record] = []
    found = []
    for _, step, r in edges:
        if step < 0:
            running = [x for x in running if x is not r]
            continue
        running.append(r)
        if len(running) > cap:
            found.append(
                _violation("cap", bucket, f"{len(running)} bodies at once > {cap}", running)
            )
    return found


def _quiet_windows(events: Events) -> list[tuple[str, str, int, int]]:
    windows = []
    for bucket, from_ns, to_ns in events.pauses:
        lost = [t for t in events.losses if from_ns <= t <= to_ns]
        windows.append(("pause", bucket, from_ns, min([to_ns, *lost])))
    for bucket, at_ns, after_ns in events.throttles:
        lost = [t for t in events.losses if at_ns <= t <= at_ns + after_ns]
        windows.append(("throttle", bucket, at_ns, min([at_ns + after_ns, *lost])))
    return windows


def check_quiet(by_bucket: dict[str, list[Record]], events: Events) -> list[dict[str, Any]]:
    found = []
    for kind, bucket, from_ns, to_ns in _quiet_windows(events):
        quiet_from = from_ns + MAX_LEAD_NS + CLOCKS_SLACK_NS
        quiet_to = to_ns - CLOCKS_SLACK_NS
        inside = [r for r in by_bucket.get(bucket, []) if quiet_from < deadline(r) < quiet_to]
        if inside:
            what = f"{len(inside)} start(s) in [{from_ns}, {to_ns}] ns"
            found.append(_violation(kind, bucket, what, inside))
    return found


def check_overrides(by_bucket: dict[str, list[Record]], events: Events) -> list[dict[str, Any]]:
    found = []
    for bucket, from_ns, to_ns, interval_us in events.overrides:
        lost = [t for t in events.losses if t >= from_ns]
        until_ns = min([to_ns, *lost])
        floor_us = interval_us - slack_us(interval_us)
        for a, b in itertools.pairwise(by_store_start(by_bucket.get(bucket, []))):
            if (
                from_ns + MAX_LEAD_NS < admitted_ns(b, events.wall_offset_ns) < until_ns
                and store_start_us(b) - store_start_us(a) < floor_us
            ):
                found.append(_violation("override", bucket, f"gap below {interval_us}us", [a, b]))
    return found


def _violation(rule: str, bucket: str, what: str, window: list[Record]) -> dict[str, Any]:
    return {"rule": rule, "bucket": bucket, "what": what, "window": list(window)}


def describe(violation: dict[str, Any]) -> str:
    """The violating window, one line per start (its store start, deadline, job, task, worker)."""
    lines = [f"{violation['rule']} {violation['bucket']}: {violation['what']}"]
    first = store_start_us(violation["window"][0]) if violation["window"] else 0
    for r in violation["window"]:
        lines.append(
            f"  +{(store_start_us(r) - first) / 1e3:9.3f} ms su={r.get('su')} "
            f"dl={deadline(r)} body={r['mono']} "
            f"{r['job']} {r['task']} r={r['r']} cost={r.get('cost', 1)} {r['host']}"
        )
    return "\n".join(lines)
