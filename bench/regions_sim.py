"""One start limit split across three regional stores: global store, static split, leased ranges.

Run: python bench/regions_sim.py [--seconds 120] [--seed 1] [--skew-ms 0.8] [--guard-ms 1]

A design study for docs/regions.md, not the package: a seeded discrete-event simulation with
no servers and no clock. Three regions (A, B, C) each have workers and a store of their own;
one-way delays are A-B 25 ms, A-C 75 ms, B-C 50 ms, and 0.5 ms from a worker to its own
store. Tasks arrive in each region as Poisson streams whose rates shift (A hot, then B, then
C); region C is cut off from the others for a stretch of the run. Every store applies the
model's slot rule (``schedule.grant``: slot = max(now, tat); a start is never sooner than the
slot, one interval after the last start, or the reply's way back), without pauses or epochs.

- ``global``: one store in A decides every start; B and C cross regions for each one.
- ``static``: each region's own store paces its share, k times the global interval.
- ``leased``: a coordinator in A hands out disjoint time ranges of the global timeline, one
  period ahead, sized by the demand each region reports every period; a region's store admits
  starts only inside its ranges (a start and the interval after it lie in one range), with a
  guard between ranges of different regions. Its store reads its own clock, off by the skew.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

US_PER_S = 1_000_000
REGIONS = ("A", "B", "C")
#: The region holding the global store (strategy global) and the coordinator (leased).
HUB = "A"
ONE_WAY_US = {
    frozenset("AB"): 25_000,
    frozenset("AC"): 75_000,
    frozenset("BC"): 50_000,
}
#: One way between a worker and the store of its own region.
LOCAL_ONE_WAY_US = 500
#: Arrival rates (tasks/s) per region in each third of the run: A hot, then B, then C.
PHASES: tuple[dict[str, float], ...] = (
    {"A": 60.0, "B": 15.0, "C": 10.0},
    {"A": 10.0, "B": 60.0, "C": 15.0},
    {"A": 15.0, "B": 10.0, "C": 60.0},
)
#: The windows whose busiest instance is compared with limit * W.
WINDOWS_US = (10_000, 100_000, 1_000_000)


@dataclass(frozen=True)
class Scenario:
    """One run: the limit, the demand's seed, the clocks and the leased protocol's knobs."""

    seconds: float = 120.0
    seed: int = 1
    limit_per_s: int = 100
    #: The arrival rates of PHASES are multiplied by this.
    load: float = 1.0
    #: The largest difference between two regions' store clocks (A reads -skew/2, B +skew/2).
    skew_us: int = 800
    #: The leased protocol's ε: the gap left between ranges of different regions.
    guard_us: int = 1_000
    #: Leases cover one period each and are sized from the demand reported every period.
    period_us: int = 500_000
    #: A period's leases leave the coordinator this long before the period begins.
    ahead_us: int = 200_000
    #: Ranges are cut in chunks of this many intervals, spread over the period.
    chunk_slots: int = 3
    #: The weight of the last period in a region's smoothed arrival rate.
    smoothing: float = 0.5
    #: Region C's link to both others is down over this share of the run (None: never).
    partition: tuple[float, float] | None = (0.45, 0.6)
    cut_region: str = "C"

    @property
    def interval_us(self) -> int:
        return US_PER_S // self.limit_per_s

    @property
    def run_us(self) -> int:
        return round(self.seconds * US_PER_S)

    @property
    def cut_us(self) -> tuple[int, int] | None:
        if self.partition is None:
            return None
        return round(self.partition[0] * self.run_us), round(self.partition[1] * self.run_us)

    def offset_us(self, region: str) -> int:
        """How far ahead of true time this region's store clock reads."""
        return {"A": -(self.skew_us // 2), "B": self.skew_us - self.skew_us // 2}.get(region, 0)

    def cut(self, src: str, dst: str, at_us: int) -> bool:
        """Whether a message between two regions sent at ``at_us`` is lost to the partition."""
        window = self.cut_us
        if window is None or src == dst or self.cut_region not in (src, dst):
            return False
        return window[0] <= at_us < window[1]


def one_way_us(src: str, dst: str) -> int:
    return LOCAL_ONE_WAY_US if src == dst else ONE_WAY_US[frozenset((src, dst))]


@dataclass(frozen=True, order=True)
class Task:
    arrival_us: int
    region: str
    seq: int


def arrivals(sc: Scenario) -> list[Task]:
    """The same Poisson arrivals for every strategy: per region, piecewise constant rates."""
    tasks: list[Task] = []
    phase_us = sc.run_us / len(PHASES)
    for region in REGIONS:
        rng = random.Random(f"{sc.seed}:{region}")
        for index, rates in enumerate(PHASES):
            t_us, end_us = index * phase_us, (index + 1) * phase_us
            while True:
                t_us += rng.expovariate(rates[region] * sc.load) * US_PER_S
                if t_us >= end_us:
                    break
                tasks.append(Task(round(t_us), region, 0))
    tasks.sort()
    return [replace(task, seq=i) for i, task in enumerate(tasks)]


@dataclass
class Run:
    """What a strategy did: each task's true start time (None: not started by the end)."""

    name: str
    sc: Scenario
    tasks: list[Task]
    start_us: dict[int, int] = field(default_factory=dict)

    def started(self, task: Task, at_us: int) -> None:
        if at_us < self.sc.run_us:
            self.start_us[task.seq] = at_us


def run_global(sc: Scenario, tasks: list[Task]) -> Run:
    """Every start is decided by the store in HUB; a reply lost to the partition loses its slot
    (the store admitted it) and the worker asks again once the link is back."""
    run = Run("global", sc, tasks)
    interval_us = sc.interval_us
    heal_us = sc.cut_us[1] if sc.cut_us else 0
    queue: list[tuple[int, int, Task]] = []
    for task in tasks:
        sent_us = heal_us if sc.cut(task.region, HUB, task.arrival_us) else task.arrival_us
        heapq.heappush(queue, (sent_us + one_way_us(task.region, HUB), task.seq, task))
    tat_us = last_us = -(10**15)
    while queue:
        now_us, _, task = heapq.heappop(queue)
        back_us = one_way_us(HUB, task.region)
        slot_us = max(now_us, tat_us)
        start_us = max(slot_us, last_us + interval_us, now_us + back_us)
        tat_us, last_us = slot_us + interval_us, start_us
        if sc.cut(HUB, task.region, now_us):
            heapq.heappush(queue, (heal_us + one_way_us(task.region, HUB), task.seq, task))
            continue
        run.started(task, start_us)
    return run


def run_static(sc: Scenario, tasks: list[Task]) -> Run:
    """Each region's store paces its own share: k times the global interval, no cross talk."""
    run = Run("static", sc, tasks)
    spacing_us = sc.interval_us * len(REGIONS)
    tat_us = dict.fromkeys(REGIONS, -(10**15))
    for task in tasks:
        now_us = task.arrival_us + LOCAL_ONE_WAY_US
        slot_us = max(now_us + LOCAL_ONE_WAY_US, tat_us[task.region])
        tat_us[task.region] = slot_us + spacing_us
        run.started(task, slot_us)
    return run


@dataclass(frozen=True)
class Lease:
    """A range of the global timeline (reference µs) in which ``region`` may admit starts."""

    region: str
    start_us: int
    end_us: int


def share(wanted: dict[str, int], alive: Sequence[str], capacity: int) -> dict[str, int]:
    """``capacity`` intervals over the live regions: what each wants, in proportion when they
    want more than there is; what is left is split evenly (room for what they have not
    reported yet)."""
    counts = dict.fromkeys(REGIONS, 0)
    total = sum(wanted[r] for r in alive)
    if total > capacity:
        for region in alive:
            counts[region] = capacity * wanted[region] // total
        by_remainder = sorted(alive, key=lambda r: -(capacity * wanted[r] % total))
        for region in by_remainder[: capacity - sum(counts.values())]:
            counts[region] += 1
        return counts
    left = capacity - total
    for i, region in enumerate(alive):
        counts[region] = wanted[region] + left // len(alive) + (1 if i < left % len(alive) else 0)
    return counts


def layout(
    counts: dict[str, int], start_us: int, sc: Scenario, prev_owner: str | None
) -> list[Lease] | None:
    """One period's leases: chunks of ``chunk_slots`` intervals, the region furthest behind its
    share first, ``guard_us`` between chunks of different regions; None if they overrun it."""
    out: list[Lease] = []
    left = dict(counts)
    t_us, owner = start_us, prev_owner
    while any(left.values()):
        region = max((r for r in REGIONS if left[r]), key=lambda r: left[r] / counts[r])
        n = min(sc.chunk_slots, left[region])
        if owner is not None and owner != region:
            t_us += sc.guard_us
        out.append(Lease(region, t_us, t_us + n * sc.interval_us))
        t_us += n * sc.interval_us
        left[region] -= n
        owner = region
    return out if t_us <= start_us + sc.period_us else None


@dataclass
class RegionStore:
    """A region's store under leases: its ranges, its pace, the tasks still without a slot."""

    leases: deque[Lease] = field(default_factory=deque)
    tat_us: int = -(10**15)
    pending: deque[Task] = field(default_factory=deque)
    arrived: int = 0


def run_leased(sc: Scenario, tasks: list[Task]) -> Run:
    """The coordinator (in HUB) issues each period's leases ``ahead_us`` before it, from the
    reports the regions send at every period boundary; a region it has not heard from for two
    periods gets nothing. A region admits starts only inside leases it holds."""
    run = Run("leased", sc, tasks)
    interval_us, period_us = sc.interval_us, sc.period_us
    stores = {r: RegionStore() for r in REGIONS}
    reports: dict[str, tuple[int, float, int]] = {}  # region -> (heard_us, rate, pending)
    events: list[tuple[int, int, str, object]] = []
    order = 0

    def push(at_us: int, kind: str, payload: object) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (at_us, order, kind, payload))

    def send(src: str, dst: str, at_us: int, kind: str, payload: object) -> None:
        if not sc.cut(src, dst, at_us):
            push(at_us + one_way_us(src, dst), kind, payload)

    def assign(region: str, now_us: int) -> None:
        """Give the waiting tasks slots inside the region's leases, on its store's clock."""
        store, offset_us = stores[region], sc.offset_us(region)
        while store.pending:
            earliest_us = max(now_us + offset_us + 2 * LOCAL_ONE_WAY_US, store.tat_us)
            while store.leases and store.leases[0].end_us < earliest_us + interval_us:
                store.leases.popleft()
            if not store.leases:
                return
            slot_us = max(earliest_us, store.leases[0].start_us)
            store.tat_us = slot_us + interval_us
            run.started(store.pending.popleft(), slot_us - offset_us)

    periods = math.ceil(sc.run_us / period_us) + 1
    for task in tasks:
        push(task.arrival_us, "arrive", task)
    for p in range(1, periods):
        for region in REGIONS:
            push(p * period_us - sc.offset_us(region), "report", region)
    for p in range(periods):
        push(max(0, p * period_us - sc.ahead_us - sc.offset_us(HUB)), "issue", p)

    prev_owner: str | None = None
    while events:
        now_us, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            assert isinstance(payload, Task)
            stores[payload.region].pending.append(payload)
            stores[payload.region].arrived += 1
            assign(payload.region, now_us)
        elif kind == "report":
            assert isinstance(payload, str)
            store = stores[payload]
            note = (store.arrived, len(store.pending))
            store.arrived = 0
            send(payload, HUB, now_us, "heard", (payload, *note))
        elif kind == "heard":
            assert isinstance(payload, tuple)
            region, arrived, pending = payload
            rate = reports[region][1] if region in reports else arrived
            rate += sc.smoothing * (arrived - rate)
            reports[region] = (now_us, rate, pending)
        elif kind == "issue":
            assert isinstance(payload, int)
            alive = [r for r in REGIONS if now_us - reports.get(r, (now_us,))[0] <= 2 * period_us]
            wanted = {
                r: math.ceil(reports[r][1]) + reports[r][2] if r in reports else 0 for r in REGIONS
            }
            capacity = period_us // interval_us
            while True:
                counts = share(wanted, alive, capacity)
                leases = layout(counts, payload * period_us, sc, prev_owner)
                if leases is not None:
                    break
                capacity -= 1
            if leases:
                prev_owner = leases[-1].region
            for region in alive:
                mine = [lease for lease in leases if lease.region == region]
                send(HUB, region, now_us, "lease", (region, mine))
        elif kind == "lease":
            assert isinstance(payload, tuple)
            region, mine = payload
            stores[region].leases.extend(mine)
            assign(region, now_us)
    return run


@dataclass(frozen=True)
class Figures:
    """A run's figures: goodput ÷ the limit, waits, busiest windows, the partition's effect."""

    goodput: float
    wait_p50_ms: float
    wait_p99_ms: float
    #: The p50 wait of the region furthest from the hub.
    far_p50_ms: float
    unstarted: int
    max_in_window: dict[int, int]
    min_gap_ms: float
    #: Starts of the cut-off region while cut off, and the last one's time after the cut.
    cut_starts: int
    cut_last_start_s: float
    #: Starts of the other regions while it is cut off, ÷ their arrivals then.
    others_in_cut: float
    #: How long after the link is back the cut-off region's last earlier arrival starts.
    cut_drained_s: float
    #: The same for every region's arrivals before the link is back.
    all_drained_s: float


def busiest(starts_us: Sequence[int], window_us: int) -> int:
    """The most starts in any half-open window ``[t, t + window_us)``."""
    most, j = 0, 0
    for i, t_us in enumerate(starts_us):
        j = max(j, i)
        while j < len(starts_us) and starts_us[j] < t_us + window_us:
            j += 1
        most = max(most, j - i)
    return most


def quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.floor(q * len(ordered)))]


def drained(run: Run, tasks: Sequence[Task], after_us: int) -> float:
    """Seconds after ``after_us`` until the last of ``tasks`` started (inf: some never did)."""
    if not all(t.seq in run.start_us for t in tasks):
        return math.inf
    last_us = max((run.start_us[t.seq] for t in tasks), default=after_us)
    return max(0, last_us - after_us) / US_PER_S


def figures(run: Run) -> Figures:
    sc, start_us = run.sc, run.start_us
    starts_us = sorted(start_us.values())
    waits_ms = {
        t.seq: (start_us[t.seq] - t.arrival_us) / 1000 for t in run.tasks if t.seq in start_us
    }
    far_ms = [waits_ms[t.seq] for t in run.tasks if t.region == "C" and t.seq in waits_ms]
    gaps_us = [b - a for a, b in itertools.pairwise(starts_us)]
    cut_starts, last_s, others = 0, math.nan, math.nan
    drained_s = everyone_s = math.nan
    if sc.cut_us is not None:
        cut0, cut1 = sc.cut_us
        mine = [
            start_us[t.seq]
            for t in run.tasks
            if t.region == sc.cut_region and cut0 <= start_us.get(t.seq, -1) < cut1
        ]
        cut_starts = len(mine)
        last_s = (max(mine) - cut0) / US_PER_S if mine else 0.0
        theirs = [t for t in run.tasks if t.region != sc.cut_region]
        started = sum(cut0 <= start_us.get(t.seq, -1) < cut1 for t in theirs)
        arrived = sum(cut0 <= t.arrival_us < cut1 for t in theirs)
        others = started / max(1, arrived)
        before = [t for t in run.tasks if t.arrival_us < cut1]
        drained_s = drained(run, [t for t in before if t.region == sc.cut_region], cut1)
        everyone_s = drained(run, before, cut1)
    return Figures(
        goodput=len(starts_us) / (sc.limit_per_s * sc.run_us / US_PER_S),
        wait_p50_ms=quantile(list(waits_ms.values()), 0.5),
        wait_p99_ms=quantile(list(waits_ms.values()), 0.99),
        far_p50_ms=quantile(far_ms, 0.5),
        unstarted=len(run.tasks) - len(starts_us),
        max_in_window={w: busiest(starts_us, w) for w in WINDOWS_US},
        min_gap_ms=min(gaps_us) / 1000 if gaps_us else math.nan,
        cut_starts=cut_starts,
        cut_last_start_s=last_s,
        others_in_cut=others,
        cut_drained_s=drained_s,
        all_drained_s=everyone_s,
    )


def window_bound(sc: Scenario, window_us: int, skew_us: int = 0) -> int:
    """limit * W, widened by a clock skew: starts whose intervals are disjoint on one timeline,
    read through clocks at most ``skew_us`` apart, fit ceil((W + skew) / interval) to a window."""
    return math.ceil((window_us + skew_us) / sc.interval_us)


def promised(sc: Scenario, strategy: str, window_us: int) -> int:
    """The most starts a strategy allows in a window of ``window_us``: limit * W for one store
    and for leases whose guard covers the skew; each region's own limit for a static split;
    widened by the true skew for leases whose guard does not cover it."""
    if strategy == "static":
        k = len(REGIONS)
        return k * math.ceil(window_us / (k * sc.interval_us))
    skewed = strategy == "leased" and sc.skew_us > sc.guard_us
    return window_bound(sc, window_us, sc.skew_us if skewed else 0)


STRATEGIES = {"global": run_global, "static": run_static, "leased": run_leased}


def cases(sc: Scenario) -> list[tuple[str, str, Scenario]]:
    """Global, static, and leased with the skew within ε, beyond it, and with no guard."""
    return [
        ("a global", "global", sc),
        ("b static", "static", sc),
        ("c leased", "leased", sc),
        ("c leased, skew > ε", "leased", replace(sc, skew_us=sc.guard_us + 4_000)),
        ("c leased, no guard", "leased", replace(sc, guard_us=0)),
    ]


def tables(sc: Scenario) -> str:
    """Two Markdown tables: the shifting demand with no partition, then with region C cut off."""
    calm = replace(sc, partition=None)
    tasks = arrivals(sc)
    windows = " / ".join(f"{w // 1000:g}" for w in WINDOWS_US)
    head = (
        f"| strategy | skew / guard (ms) | goodput | wait p50 / p99 (ms) | C p50 (ms) "
        f"| unstarted | most starts in {windows} ms | bound | min gap (ms) |"
    )
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for label, name, s in cases(calm):
        f = figures(STRATEGIES[name](s, tasks))
        most = " / ".join(str(f.max_in_window[w]) for w in WINDOWS_US)
        bound = " / ".join(str(promised(s, name, w)) for w in WINDOWS_US)
        lines.append(
            f"| {label} | {s.skew_us / 1000:g} / {s.guard_us / 1000:g} | {f.goodput:.3f} "
            f"| {f.wait_p50_ms:.0f} / {f.wait_p99_ms:.0f} | {f.far_p50_ms:.0f} | {f.unstarted} "
            f"| {most} | {bound} | {f.min_gap_ms:.2f} |"
        )
    demand = sc.load * sum(sum(p.values()) for p in PHASES) / len(PHASES) / sc.limit_per_s
    lines += [
        "",
        f"limit {sc.limit_per_s}/s (interval {sc.interval_us / 1000:g} ms), demand "
        f"{demand:.2f} of it, {sc.seconds:g} s, seed {sc.seed}; leases: period "
        f"{sc.period_us / 1000:g} ms, sent {sc.ahead_us / 1000:g} ms ahead, chunks of "
        f"{sc.chunk_slots} intervals",
        "",
    ]
    if sc.cut_us is None:
        return "\n".join(lines)
    cut0, cut1 = sc.cut_us
    head = (
        "| strategy | cut off | goodput | its starts while cut | its last start after the cut (s) "
        "| the others' starts ÷ arrivals while cut | its backlog drained after heal (s) "
        "| every backlog drained after heal (s) |"
    )
    lines += [head, "|---" * (head.count("|") - 1) + "|"]
    runs = [(label, name, s) for label, name, s in cases(sc)[:3]]
    hub_cut = replace(sc, cut_region=HUB)
    runs += [(label, name, hub_cut) for label, name, _ in cases(sc) if name != "static"][:2]
    for label, name, s in runs:
        f = figures(STRATEGIES[name](s, tasks))
        lines.append(
            f"| {label} | {s.cut_region} | {f.goodput:.3f} | {f.cut_starts} "
            f"| {f.cut_last_start_s:.2f} | {f.others_in_cut:.3f} | {f.cut_drained_s:.2f} "
            f"| {f.all_drained_s:.2f} |"
        )
    lines += [
        "",
        f"one region cut off from the other two from {cut0 / US_PER_S:g} s to "
        f"{cut1 / US_PER_S:g} s; {HUB} holds the global store and the coordinator",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skew-ms", type=float, default=0.8, help="true clock skew")
    parser.add_argument("--guard-ms", type=float, default=1.0, help="the protocol's ε")
    parser.add_argument("--period-ms", type=float, default=500.0)
    parser.add_argument("--chunk", type=int, default=3, help="intervals per leased range")
    parser.add_argument("--load", type=float, default=1.0, help="scales the arrival rates")
    parser.add_argument("--no-partition", action="store_true")
    args = parser.parse_args()
    sc = Scenario(
        seconds=args.seconds,
        seed=args.seed,
        load=args.load,
        skew_us=round(args.skew_ms * 1000),
        guard_us=round(args.guard_ms * 1000),
        period_us=round(args.period_ms * 1000),
        chunk_slots=args.chunk,
        partition=None if args.no_partition else (0.45, 0.6),
    )
    print(tables(sc))


if __name__ == "__main__":
    main()
