"""Fair share of one shared limit among tenants: first-fit outer, static split, fair outer.

Run:
  python bench/fair.py [--broker redis|rabbitmq] [--modes fifo,static,fair] [--flood 20000]
                       [--small-keys 50] [--own 0.001] [--seconds 90] [--save FILE] [--json]

One run per broker measures three modes side by side, each on a fresh queue and the same setup
(``--workers`` real ``celery worker`` processes x prefork 2, ``tests/helpers/workerapp.py``'s
``workerapp.tenant(key, i)``, whose bucket is ``queue:key``), under one shared limit of
``--limit`` starts a second:

- ``fifo``: ``{'q': limit, 'q:*': {'outer': 'q'}}``, each key's own interval ``--own``: the
  keys spend the outer's budget first-fit;
- ``static``: no outer; each key's own interval is N / limit seconds for the N keys that exist
  (the flood and the small keys), so the keys' rates add up to the limit;
- ``fair``: ``{'q': {'interval': ..., 'fair': True}, 'q:*': {'outer': 'q'}}`` with the weights
  as per-key entries (``'q:small7': {'weight': 2}``), own interval ``--own``.

Workload of each mode: ``--flood`` tasks of key ``flood`` (weight 1) go into the broker first;
``--delay`` seconds after all of them are sent (and the flood has started), ``--small-keys``
keys of ``--small-tasks`` tasks each arrive, one every ``--every`` seconds (weights cycling 1,
2, 3; the store's TIME read just before each key's first send). A mode ends when every small
key has finished, or ``--seconds`` after the flood was sent; the workers stop and the queues
are deleted (the flood does not finish).

From the keys' ledgers (store clock, one start per task: the last admitted ``claim:OK``):

- fair-share ratio: per 10 s window (from the first start), for every key backlogged (sent, not
  started) during the whole window, its starts / its weighted max-min share of the window's
  starts. The share is taken start by start: each start in the window is divided among the keys
  backlogged at that instant, water-filled by weight up to each key's own rate (its own
  interval; only binding in ``static``) out of ``--limit``. Reported: min and median;
- Jain's index of those ratios among the keys of one weight backlogged during a whole window
  (groups of two or more); reported: the minimum over windows and weights;
- a small key's finish (its last start) after its first send, against the time its tasks take
  alone at the share it had when sent (``small-tasks`` / (its share of ``limit``)), and
  against its finish under the ideal fluid fair share with the same sends (``fluid``: its
  share follows the keys that arrive and finish later): p50 / max;
- most starts short: the most a backlogged key got below its share in one window, in starts,
  and how many key-windows were short by more than one start (a scheduler of whole starts
  is short by up to one at a window's edge even when exact: 4 starts of a 4.9 share is 0.82);
- utilization: starts / (limit x span), the span from the first start to the stop, while the
  flood always had work;
- unused budget (``fifo``, ``fair``): the seconds of the limit's budget between starts, by
  phase (the flood alone, or shared) and by whether any claim came in that time (``waited``:
  each was told to wait) or none (``no_claim``: the workers came late);
- pairs of consecutive starts (all keys) closer than 1 / limit; in ``static`` (no outer) per key
  closer than its own interval; and the most starts in any 1 s.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kombu
import redis
from harness import ProcessGroups, machine_line, markdown_table, note, publish_copy

from celery_interval.config import settings_of
from celery_interval.demo.app import make_app
from celery_interval.demo.embedded import RedisProc
from celery_interval.starts import happened
from celery_interval.stores.redis import RedisStore

ROOT = Path(__file__).resolve().parents[1]
RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"
TASK = "workerapp.tenant"
CONCURRENCY = 2
MODES = ("fifo", "static", "fair")
WINDOW_US = 10_000_000
FLOOD = "flood"


@dataclass(frozen=True)
class Workload:
    limit: float
    own_s: float
    flood: int
    small_keys: int
    small_tasks: int

    def names(self) -> list[str]:
        return [FLOOD, *(f"small{k}" for k in range(self.small_keys))]

    def weight(self, key: str) -> int:
        return 1 if key == FLOOD else int(key.removeprefix("small")) % 3 + 1

    def count(self, key: str) -> int:
        return self.flood if key == FLOOD else self.small_tasks

    def own_interval_s(self, mode: str) -> float:
        """Each key's own interval: tiny where an outer holds the limit, N / limit in static."""
        return len(self.names()) / self.limit if mode == "static" else self.own_s

    def queues(self, mode: str, queue: str) -> dict[str, Any]:
        own = self.own_interval_s(mode)
        if mode == "static":
            return {f"{queue}:*": {"interval": own}}
        declared: dict[str, Any] = {
            queue: {"interval": 1 / self.limit, "fair": mode == "fair"},
            f"{queue}:*": {"interval": own, "outer": queue},
        }
        if mode == "fair":
            declared.update({f"{queue}:{k}": {"weight": self.weight(k)} for k in self.names()})
        return declared


@dataclass
class Broker:
    url: str

    def delete(self, names: list[str]) -> None:
        with kombu.Connection(self.url) as conn:
            channel = conn.channel()
            for name in names:
                with contextlib.suppress(*conn.channel_errors):
                    channel.queue_delete(name)

    def queued(self, queue: str) -> int:
        with kombu.Connection(self.url) as conn:
            try:
                declared = conn.channel().queue_declare(queue, passive=True)
            except conn.channel_errors:
                return 0
        return int(declared.message_count)


@contextlib.contextmanager
def servers(broker: str) -> Iterator[tuple[Broker, RedisProc]]:
    """A store of its own; the broker a redis-server of its own, or the local RabbitMQ."""
    with RedisProc(unix_socket=True) as store:
        if broker == "redis":
            with RedisProc() as broker_proc:
                yield Broker(broker_proc.broker_url_for(1)), store
        else:
            yield Broker(RABBITMQ_URL), store


def now_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


def start_workers(
    app: Any, broker: Broker, store: RedisProc, queue: str, conf: dict[str, Any], own_s: float,
    workers: int,
) -> ProcessGroups:  # fmt: skip
    env = dict(os.environ)
    env.update(
        {
            "CI_TEST_BROKER": broker.url,
            "CI_TEST_STORE": store.url,
            "CI_TEST_QUEUE": queue,
            "CI_TEST_INTERVAL": str(conf["interval_queues"].get(queue, {}).get("interval", 0.02)),
            "CI_TEST_CONF": json.dumps(conf),
            "CI_TEST_RECORD": "",
            "CI_TEST_TENANT_INTERVAL": repr(own_s),
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
        }
    )
    names = [f"w{n + 1}-{queue}@bench" for n in range(workers)]
    commands = [
        [
            sys.executable, "-m", "celery", "-A", "tests.helpers.workerapp", "worker", "-Q",
            queue, "-P", "prefork", "-c", str(CONCURRENCY), "-n", name, "-l", "WARNING",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]
        for name in names
    ]  # fmt: skip
    groups = ProcessGroups()
    groups.start(commands, env)
    pending, deadline = set(names), time.monotonic() + 90
    while pending:
        groups.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers not ready: {pending}; logs in {groups.log_dir}")
        with contextlib.suppress(OSError):
            for reply in app.control.ping(destination=list(pending), timeout=0.5) or []:
                pending -= set(reply)
    return groups


def fill(app: Any, broker: Broker, queue: str, key: str, count: int) -> None:
    """Publish ``count`` copies of one real message of ``workerapp.tenant(key, i)`` with fresh
    ids (faster than sending each through Celery's producer)."""
    aside = f"{queue}-template"
    app.send_task(TASK, args=(key, 0), queue=aside)
    with kombu.Connection(broker.url) as conn:
        message = kombu.Queue(aside, kombu.Exchange(aside), aside)(conn.channel()).get(no_ack=True)
        if message is None:
            raise RuntimeError("the template message did not arrive")
        producer = kombu.Producer(conn.channel(), exchange=kombu.Exchange(""))
        for i in range(count):
            publish_copy(producer, message, queue, [key, i])
    broker.delete([aside])


class Records:
    """The bodies' start records (``record:<queue>`` in the store), read as they grow."""

    def __init__(self, client: redis.Redis, queue: str) -> None:
        self.client, self.key, self.rows = client, f"record:{queue}", []

    def read(self) -> list[dict[str, Any]]:
        self.rows += [json.loads(r) for r in self.client.lrange(self.key, len(self.rows), -1)]
        return self.rows


def run_mode(mode: str, broker: Broker, store: RedisProc, load: Workload, args: Any) -> dict:
    queue = f"fair{mode}{uuid.uuid4().hex[:6]}"
    conf = {"interval_queues": load.queues(mode, queue), "control_exchange": f"celery-{queue}"}
    app = make_app(broker.url, store.url, queue, 1 / load.limit, **conf)
    client = redis.Redis.from_url(store.url)
    records = Records(client, queue)
    groups = start_workers(app, broker, store, queue, conf, load.own_interval_s(mode), args.workers)
    sends: dict[str, int] = {}
    try:
        sends[FLOOD] = now_us(client)
        began = time.monotonic()
        fill(app, broker, queue, FLOOD, load.flood)
        note(f"{mode}: {load.flood:,} flood tasks sent in {time.monotonic() - began:.1f}s")
        while not records.read():
            groups.check_alive()
            if time.monotonic() - began > 120:
                raise RuntimeError(f"no start after 120 s; logs in {groups.log_dir}")
            time.sleep(0.1)
        first = time.monotonic()
        deadline = first + args.seconds
        time.sleep(args.delay)
        queued_at_first_small = broker.queued(queue)
        small = load.names()[1:]
        with app.producer_or_acquire() as producer:
            for n, key in enumerate(small):
                while time.monotonic() < first + args.delay + n * args.every:
                    time.sleep(0.01)
                sends[key] = now_us(client)
                for i in range(load.small_tasks):
                    app.send_task(TASK, args=(key, i), queue=queue, producer=producer)
        while time.monotonic() < deadline:
            groups.check_alive()
            ran = {(r["args"][0], r["id"]) for r in records.read()}
            if all((sum(1 for k, _id in ran if k == key)) >= load.small_tasks for key in small):
                break
            time.sleep(0.5)
        stop_us = now_us(client)
        queued_at_stop = broker.queued(queue)
    finally:
        groups.stop()
        overflow = [f"ci-overflow:{queue}:{k}" for k in load.names()]
        broker.delete([queue, f"{queue}-template", *overflow])
    groups.remove_logs()
    time.sleep(0.5)
    rows = records.read()
    store_reader = RedisStore.from_url(store.url, nesting=settings_of(app).outer_of)
    starts, readmits, ledgers = read_starts(store_reader, queue, load.names())
    ids = [r["id"] for r in rows]
    ledger_starts = sum(len(s) for s in starts.values())
    if args.save:
        raw = {"mode": mode, "sends": sends, "starts": starts, "stop_us": stop_us}
        if args.save_ledgers:
            raw["ledgers"] = ledgers
        with open(args.save, "a") as out:
            out.write(json.dumps(raw) + "\n")
    figures = measure(mode, load, sends, starts, stop_us)
    if mode != "static":
        figures["lost_s"] = lost_budget(load, sends, starts, ledgers, stop_us)
    return {
        "mode": mode,
        "queue": queue,
        "queued_at_first_small": queued_at_first_small,
        "queued_at_stop": queued_at_stop,
        "run_s": (stop_us - min(s[0] for s in starts.values() if s)) / 1e6,
        "ledger_starts": ledger_starts,
        "body_starts": len(ids),
        "duplicate_bodies": len(ids) - len(set(ids)),
        "readmits": readmits,
        **figures,
    }


def read_starts(
    store: RedisStore, queue: str, keys: list[str]
) -> tuple[dict[str, list[int]], int, dict[str, list[dict[str, str]]]]:
    """Each key's starts (µs, sorted), one per task (the last admitted), the readmits, and each
    key's ledger entries."""
    starts: dict[str, list[int]] = {}
    ledgers: dict[str, list[dict[str, str]]] = {}
    readmits = 0
    for key in keys:
        entries: list[dict[str, str]] = []
        start_id = "-"
        while page := store.ledger(f"{queue}:{key}", start_id, count=10_000):
            entries += [fields for _id, fields in page]
            start_id = "(" + page[-1][0]
        kept = happened(entries)
        readmits += sum(1 for f in kept if f.get("readmit") == "1")
        by_task = {f["task"]: int(f["start"]) for f in kept}
        starts[key] = sorted(by_task.values())
        ledgers[key] = entries
    return starts, readmits, ledgers


def lost_budget(
    load: Workload,
    sends: dict[str, int],
    starts: dict[str, list[int]],
    ledgers: dict[str, list[dict[str, str]]],
    stop_us: int,
) -> dict[str, float]:
    """Where the shared limit's unused budget went, in seconds of it: each gap between
    consecutive starts (all keys) beyond one interval, by the phase (the flood the only key
    backlogged, or shared) and by what the ledgers show inside it (past the interval): no claim
    of any key (the workers came late), or only claims answered WAIT (told to wait for the
    budget or their turn)."""
    spacing_us = round(1e6 / load.limit)
    claims = sorted(
        int(f["now"])
        for entries in ledgers.values()
        for f in entries
        if f.get("op", "").startswith("claim:")
    )
    merged = sorted((t, k) for k in starts for t in starts[k] if t <= stop_us)
    small = [k for k in starts if k != FLOOD]

    def shared(t: int) -> bool:
        return any(
            sends[k] <= t and bisect.bisect_left(starts[k], t) < load.count(k) for k in small
        )

    lost = {"flood_alone_no_claim": 0.0, "flood_alone_waited": 0.0,
            "shared_no_claim": 0.0, "shared_waited": 0.0}  # fmt: skip
    for (a, _ka), (b, _kb) in itertools.pairwise(merged):
        free_us = a + spacing_us
        if b <= free_us:
            continue
        any_claim = bisect.bisect_left(claims, b) > bisect.bisect_left(claims, free_us)
        phase = "shared" if shared(free_us) else "flood_alone"
        lost[f"{phase}_{'waited' if any_claim else 'no_claim'}"] += (b - free_us) / 1e6
    return {k: round(v, 2) for k, v in lost.items()}


def water_fill(weights: dict[str, int], caps: dict[str, float], capacity: float) -> dict:
    """Max-min fair rates by weight: a key held below its share by its cap gets its cap, the
    rest is shared by the others, in proportion to their weights."""
    rates: dict[str, float] = {}
    left, open_keys = capacity, set(weights)
    while open_keys:
        total = sum(weights[k] for k in open_keys)
        capped = {k for k in open_keys if caps[k] <= left * weights[k] / total}
        if not capped:
            rates.update({k: left * weights[k] / total for k in open_keys})
            break
        for k in capped:
            rates[k] = caps[k]
            left -= caps[k]
        open_keys -= capped
    return rates


def fluid_finish_us(
    sends: dict[str, int],
    counts: dict[str, int],
    weights: dict[str, int],
    caps: dict[str, float],
    capacity: float,
) -> dict[str, int]:
    """When each key would finish under the ideal fluid fair share (weighted max-min, each key
    at most its cap, ``capacity`` starts a second shared), with the same sends: the baseline
    of a key's finish. Between two events (a send, a key done) the rates are ``water_fill``'s."""
    left = {k: float(n) for k, n in counts.items()}
    arrivals = sorted(sends.values())
    finish: dict[str, int] = {}
    now = float(arrivals[0])
    while len(finish) < len(left):
        active = [k for k in left if sends[k] <= now and k not in finish]
        later = [a for a in arrivals if a > now]
        if not active:
            now = float(later[0])
            continue
        rates = water_fill({k: weights[k] for k in active}, caps, capacity)
        done_in = min(left[k] / rates[k] * 1e6 for k in active if rates[k] > 0)
        step = min(done_in, later[0] - now) if later else done_in
        for k in active:
            left[k] -= rates[k] * step / 1e6
            if left[k] <= 1e-9:
                finish[k] = round(now + step)
        now += step
    return finish


def measure(
    mode: str, load: Workload, sends: dict[str, int], starts: dict[str, list[int]], stop_us: int
) -> dict[str, Any]:
    keys = list(starts)
    weight = {k: load.weight(k) for k in keys}
    cap = {k: 1 / load.own_interval_s(mode) for k in keys}
    merged = sorted((t, k) for k in keys for t in starts[k])
    t0 = merged[0][0]

    def backlogged(key: str, t: int) -> bool:
        """Sent at or before ``t`` and a task of it not started before ``t``."""
        return sends[key] <= t and bisect.bisect_left(starts[key], t) < load.count(key)

    def fractions(t: int, also: str = "") -> dict[str, float]:
        waiting = [k for k in keys if backlogged(k, t) or k == also]
        rates = water_fill({k: weight[k] for k in waiting}, cap, load.limit)
        total = sum(rates.values())
        return {k: r / total for k, r in rates.items()}

    share_at = [fractions(t, also=k) for t, k in merged]
    ratios: list[float] = []
    shorts: list[float] = []
    jains: list[float] = []
    starved_groups = 0
    windows = []
    for a in range(t0, stop_us - WINDOW_US + 1, WINDOW_US):
        b = a + WINDOW_US
        lo, hi = bisect.bisect_left(merged, (a, "")), bisect.bisect_left(merged, (b, ""))
        whole = [
            k for k in keys if sends[k] <= a and bisect.bisect_left(starts[k], b) < load.count(k)
        ]
        got = {k: sum(1 for _t, key in merged[lo:hi] if key == k) for k in whole}
        fair = {k: sum(share_at[j].get(k, 0.0) for j in range(lo, hi)) for k in whole}
        ratio = {k: got[k] / fair[k] for k in whole if fair[k] > 0}
        ratios += ratio.values()
        shorts += [fair[k] - got[k] for k in ratio]
        for w in {weight[k] for k in ratio}:
            same = [ratio[k] for k in ratio if weight[k] == w]
            if len(same) >= 2 and any(same):
                jains.append(sum(same) ** 2 / (len(same) * sum(x * x for x in same)))
            elif len(same) >= 2:
                starved_groups += 1  # every key of the group had no start: no index
        windows.append(
            {"from_s": (a - t0) / 1e6, "starts": hi - lo, "backlogged": len(ratio),
             "min_ratio": min(ratio.values(), default=None),
             "flood_ratio": ratio.get(FLOOD)}
        )  # fmt: skip

    finish: list[float] = []
    finish_fluid: list[float] = []
    finish_s: list[float] = []
    unfinished = 0
    fluid_us = fluid_finish_us(sends, {k: load.count(k) for k in keys}, weight, cap, load.limit)
    for k in keys[1:]:
        if len(starts[k]) < load.small_tasks:
            unfinished += 1
            continue
        took_s = (starts[k][-1] - sends[k]) / 1e6
        alone_s = load.small_tasks / (load.limit * fractions(sends[k], also=k)[k])
        finish.append(took_s / alone_s)
        finish_fluid.append(took_s / ((fluid_us[k] - sends[k]) / 1e6))
        finish_s.append(took_s)

    waits = [(starts[k][0] - sends[k]) / 1e6 for k in keys[1:] if starts[k]]
    within = [t for t, _k in merged if t <= stop_us]
    gaps = [b - a for (a, _ka), (b, _kb) in itertools.pairwise(merged)]
    own_us = load.own_interval_s(mode) * 1e6
    per_key_short = sum(1 for k in keys for a, b in itertools.pairwise(starts[k]) if b - a < own_us)
    most_in_1s = max(bisect.bisect_left(within, t + 1_000_000) - n for n, t in enumerate(within))
    return {
        "windows": windows,
        "share_ratio_min": min(ratios, default=None),
        "share_ratio_median": statistics.median(ratios) if ratios else None,
        "share_ratio_n": len(ratios),
        "share_ratio_below_0_9": sum(r < 0.9 for r in ratios),
        "share_short_max": max(shorts, default=None),
        "share_short_over_1": sum(s > 1 for s in shorts),
        "jain_min": min(jains, default=None),
        "jain_groups": len(jains),
        "jain_starved_groups": starved_groups,
        "finish_ratio_p50": statistics.median(finish) if finish else None,
        "finish_ratio_max": max(finish, default=None),
        "finish_fluid_p50": statistics.median(finish_fluid) if finish_fluid else None,
        "finish_fluid_max": max(finish_fluid, default=None),
        "finish_s_p50": statistics.median(finish_s) if finish_s else None,
        "finish_s_max": max(finish_s, default=None),
        "small_first_start_s_p50": statistics.median(waits) if waits else None,
        "small_first_start_s_max": max(waits, default=None),
        "small_started": len(waits),
        "small_finished": len(finish),
        "small_unfinished": unfinished,
        "utilization": (len(within) - 1) / (load.limit * (within[-1] - t0) / 1e6),
        "gaps_below_limit": sum(g < 1e6 / load.limit for g in gaps),
        "min_gap_ms": min(gaps) / 1e3,
        "per_key_gaps_below_own": per_key_short,
        "most_starts_in_1s": most_in_1s,
        "flood_starts": len(starts[FLOOD]),
    }


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def table(results: list[dict[str, Any]]) -> str:
    header = ["mode", "share ratio min / median (n)", "below 0.9", "most starts short (> 1)",
              "Jain min (groups)", "small 1st start s p50 / max (started)",
              "small finish ÷ alone p50 / max", "small finish ÷ fluid p50 / max",
              "small finish s p50 / max", "finished",
              "utilization", "gaps < 20 ms (min)", "per-key gaps < own", "most in 1 s",
              "starts (flood)", "dup bodies"]  # fmt: skip
    rows = [
        [
            r["mode"],
            f"{fmt(r['share_ratio_min'])} / {fmt(r['share_ratio_median'])} ({r['share_ratio_n']})",
            str(r["share_ratio_below_0_9"]),
            f"{fmt(r['share_short_max'], '.1f')} ({r['share_short_over_1']})",
            f"{fmt(r['jain_min'], '.3f')} ({r['jain_groups']})",
            f"{fmt(r['small_first_start_s_p50'], '.1f')} / "
            f"{fmt(r['small_first_start_s_max'], '.1f')} ({r['small_started']})",
            f"{fmt(r['finish_ratio_p50'])} / {fmt(r['finish_ratio_max'])}",
            f"{fmt(r['finish_fluid_p50'])} / {fmt(r['finish_fluid_max'])}",
            f"{fmt(r['finish_s_p50'], '.1f')} / {fmt(r['finish_s_max'], '.1f')}",
            f"{r['small_finished']}/{r['small_finished'] + r['small_unfinished']}",
            fmt(r["utilization"], ".3f"),
            f"{r['gaps_below_limit']} ({r['min_gap_ms']:.2f} ms)",
            str(r["per_key_gaps_below_own"]),
            str(r["most_starts_in_1s"]),
            f"{r['ledger_starts']:,} ({r['flood_starts']:,})",
            str(r["duplicate_bodies"]),
        ]
        for r in results
    ]
    return markdown_table(header, rows, "l" + "r" * 15)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated")
    parser.add_argument("--limit", type=float, default=50.0, help="shared starts a second")
    parser.add_argument("--own", type=float, default=0.001, help="own interval (fifo, fair), s")
    parser.add_argument("--flood", type=int, default=20_000)
    parser.add_argument("--small-keys", type=int, default=50)
    parser.add_argument("--small-tasks", type=int, default=20)
    parser.add_argument("--delay", type=float, default=5.0, help="s after the flood's 1st start")
    parser.add_argument("--every", type=float, default=0.75, help="s between small keys")
    parser.add_argument("--seconds", type=float, default=90.0, help="longest run of a mode")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--save", default="", help="append each mode's sends and starts here")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument(
        "--save-ledgers", action="store_true", help="with --save: each key's ledger entries too"
    )
    args = parser.parse_args(argv)
    load = Workload(args.limit, args.own, args.flood, args.small_keys, args.small_tasks)
    modes = [m for m in args.modes.split(",") if m]
    note(machine_line())
    results = []
    with servers(args.broker) as (broker, store):
        for mode in modes:
            results.append(run_mode(mode, broker, store, load, args))
            note(json.dumps({k: v for k, v in results[-1].items() if k != "windows"}))
    summary = {"broker": args.broker, "workers": args.workers, **vars(args), "results": results}
    if args.json:
        print(json.dumps(summary))
        return
    print(machine_line())
    print(f"broker {args.broker}, {args.workers} workers x prefork {CONCURRENCY}")
    print(table(results))
    for r in results:
        flood = " ".join(fmt(w["flood_ratio"]) for w in r["windows"])
        print(f"{r['mode']}: flood's ratio per window: {flood}")
        if "lost_s" in r:
            print(f"{r['mode']}: unused budget, s: {r['lost_s']}")
    print(json.dumps({**summary, "results": [
        {k: v for k, v in r.items() if k != "windows"} for r in results]}))  # fmt: skip


if __name__ == "__main__":
    main()
