"""Side by side against a real limiting server: how queue-side limiters keep under a hidden limit.

Run: python bench/limits.py [--quick] [--seconds 20] [--rate 10] [--burst 5]
[--believed-rate 15] [--drop 0.5] [--workers 3] [--systems a,b] [--retry-after seconds|date]
[--json].

One run per system, same machine, same workload: W real ``celery worker`` processes (prefork
``-c 2``; broker: a fresh private redis-server per system, as in bench/compare.py), a backlog
of tasks enqueued at t = 0, each task one HTTP GET to bench/limiting_server.py. The server
enforces a token bucket (``--rate`` R/s, ``--burst`` B) the clients are not told and answers
429 with Retry-After (ceil of the seconds until a token) above it. At t = T/2 it lowers its
limit to ``--drop`` x R (``POST /admin/limit``); at t = T the bench reads the server's counts
(``GET /admin/stats?events=1``) and stops the workers. The backlog is large enough never to
run out. The users believe the limit is ``--believed-rate`` (default 1.5 x R). Systems:

- celery_rate_limit: ``rate_limit`` = the believed rate (Celery's bucket is per worker), a
  429 retries with ``countdown`` = Retry-After;
- celery_rate_limit_per_worker: the same with ``rate_limit`` = believed rate / W;
- plain_retry: no limit; a 429 retries with ``countdown`` = Retry-After;
- celery_interval_retry: IntervalTask, ``interval_queues`` = the believed interval, a 429
  retries with ``countdown`` = Retry-After;
- celery_interval_throttled: IntervalTask at the believed interval, a 429 raises
  ``celery_interval.Throttled.from_response(resp)`` with the queue declared ``adaptive``; skipped
  with one line when ``celery_interval.Throttled`` is not there.

Reported per system: calls, 429 share (all, before and after the drop), goodput (accepted
calls per second) as a fraction of the server's limit in each phase (the first phase can pass
1.0 by up to B / (R x T/2): the bucket starts full), completed tasks, and recovery: the
seconds from the drop to the start of the first 1 s window (windows stepped by 50 ms) from
which every later window has a 429 share below 5 % (a system never over the limit after the
drop recovers in 0 s; "no" when it has not by 2 s before T). A system whose calls simply
stopped counts as recovered: read recovery next to its goodput after the drop.
``--json`` prints one object ``{"results": [...], "skipped": [...], "params": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

from harness import (
    ProcessGroups,
    Servers,
    machine_line,
    markdown_table,
    measured_server,
    note,
    recorder_server,
    wait_ready,
    worker_env,
)
from limiting_server import ENV_API, LimitingServer
from recording import ENV_CONF, ENV_RATE_LIMIT, ENV_TASK, QUEUE, STARTS_KEY

from celery_interval.demo.app import make_app

SYSTEMS = (
    "celery_rate_limit",
    "celery_rate_limit_per_worker",
    "plain_retry",
    "celery_interval_retry",
    "celery_interval_throttled",
)
CONCURRENCY = 2
QUICK_SECONDS = 8.0
#: A 1 s window "keeps under the limit" when below this share of its calls got a 429.
RECOVERED_SHARE = 0.05
WINDOW_S = 1.0
WINDOW_STEP_S = 0.05


def throttled_missing() -> str | None:
    """Why celery_interval_throttled cannot run here, or None when it can."""
    try:
        from celery_interval import Throttled  # type: ignore[attr-defined]
    except ImportError as exc:
        return f"celery_interval.Throttled is not importable ({exc})"
    if not callable(getattr(Throttled, "from_response", None)):
        return "celery_interval.Throttled has no from_response"
    return None


@dataclass(frozen=True)
class Params:
    """One bench invocation's settings."""

    seconds: float
    rate: float
    burst: float
    believed_rate: float
    drop: float
    workers: int
    tasks: int
    retry_after: str
    adaptive: Any


def system_env(name: str, servers: Servers, api_url: str, p: Params) -> dict[str, str]:
    """The worker environment of system ``name``."""
    believed_interval_s = 1 / p.believed_rate
    task, rate_limit, conf = {
        "celery_rate_limit": ("limits.rate_limited", f"{p.believed_rate:g}/s", {}),
        "celery_rate_limit_per_worker": (
            "limits.rate_limited",
            f"{p.believed_rate / p.workers:g}/s",
            {},
        ),
        "plain_retry": ("limits.plain_retry", "", {}),
        "celery_interval_retry": ("limits.interval_retry", "", {}),
        "celery_interval_throttled": (
            "limits.interval_throttled",
            "",
            {"interval_queues": {QUEUE: {"adaptive": p.adaptive}}},
        ),
    }[name]
    return worker_env(
        servers,
        believed_interval_s,
        **{
            ENV_TASK: task,
            ENV_RATE_LIMIT: rate_limit,
            ENV_CONF: json.dumps(conf),
            ENV_API: api_url,
        },
    )


def worker_command(n: int) -> list[str]:
    return [
        sys.executable, "-m", "celery", "-A", "workload_limits", "worker", "-Q", QUEUE,
        "-P", "prefork", "-c", str(CONCURRENCY), "-n", f"w{n + 1}@limits", "-l", "WARNING",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip


def _post(url: str) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(urllib.request.Request(url, method="POST"), timeout=10) as r:
        r.read()


def _get_json(url: str) -> dict[str, Any]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=30) as r:
        return dict(json.loads(r.read()))


def run_one(name: str, recorder_url: str, p: Params) -> dict[str, Any]:
    """One system's run against a fresh limiting server and a fresh broker."""
    with (
        measured_server(recorder_url) as servers,
        LimitingServer(rate=p.rate, burst=p.burst, retry_after=p.retry_after) as api,
    ):
        env = system_env(name, servers, api.url, p)
        task = env[ENV_TASK]
        groups = ProcessGroups()
        try:
            groups.start([worker_command(n) for n in range(p.workers)], env)
            wait_ready(groups, servers.recorder, p.workers * (CONCURRENCY + 1), timeout_s=90)
            time.sleep(0.5)  # let every consumer settle into its fetch loop
            sender = make_app(servers.broker_url, servers.store_url, QUEUE, 1 / p.believed_rate)
            with sender.producer_or_acquire() as producer:
                producer.connection.ensure_connection()
                _post(f"{api.url}/admin/reset?rate={p.rate:g}&burst={p.burst:g}")
                began = time.monotonic()
                for i in range(p.tasks):
                    sender.send_task(task, args=(i,), producer=producer)
            enqueued_s = time.monotonic() - began
            time.sleep(max(0.0, began + p.seconds / 2 - time.monotonic()))
            _post(f"{api.url}/admin/limit?rate={p.rate * p.drop:g}&burst={p.burst:g}")
            time.sleep(max(0.0, began + p.seconds - time.monotonic()))
            stats = _get_json(f"{api.url}/admin/stats?events=1")
            groups.check_alive()
            raw = servers.recorder.lrange(STARTS_KEY, 0, -1)
        finally:
            groups.stop()
    groups.remove_logs()
    done = [json.loads(r) for r in raw]
    return summarize(name, p, stats, done, began, enqueued_s)


def summarize(
    name: str,
    p: Params,
    stats: dict[str, Any],
    done: list[dict[str, Any]],
    began: float,
    enqueued_s: float,
) -> dict[str, Any]:
    """One result row from the server's events and the tasks' completion records."""
    events = [(float(t), bool(ok)) for t, ok in stats["events"] if t <= p.seconds]
    drop_t = float(stats["limits"][1]["t"]) if len(stats["limits"]) > 1 else p.seconds / 2
    before = [ok for t, ok in events if t < drop_t]
    after = [ok for t, ok in events if t >= drop_t]
    completed_ids = {d["id"] for d in done if d["mono_ns"] / 1e9 - began <= p.seconds}
    in_time = [d for d in done if d["mono_ns"] / 1e9 - began <= p.seconds]
    rate_after = p.rate * p.drop
    accepted = sum(ok for _, ok in events)
    return {
        "system": name,
        "calls": len(events),
        "accepted": accepted,
        "rejected": len(events) - accepted,
        "share_429": _share(events),
        "share_429_before": _share([(0.0, ok) for ok in before]),
        "share_429_after": _share([(0.0, ok) for ok in after]),
        "goodput_before": sum(before) / drop_t / p.rate,
        "goodput_after": sum(after) / max(1e-9, p.seconds - drop_t) / rate_after,
        "goodput": accepted / (p.rate * drop_t + rate_after * (p.seconds - drop_t)),
        "completed": len(completed_ids),
        "duplicates": len(in_time) - len(completed_ids),
        "retries": sum(int(d.get("retries") or 0) for d in in_time),
        "peak_calls_per_s": max(
            (s["accepted"] + s["rejected"] for s in stats["series"]), default=0
        ),
        "recovery_s": recovery_s(events, drop_t, p.seconds),
        "drop_at_s": drop_t,
        #: [accepted, rejected] per second of the run, from the server's counts
        "per_second": [[s["accepted"], s["rejected"]] for s in stats["series"]][
            : math.ceil(p.seconds)
        ],
        "enqueue_s": enqueued_s,
    }


def _share(events: list[tuple[float, bool]]) -> float | None:
    return None if not events else sum(not ok for _, ok in events) / len(events)


def recovery_s(events: list[tuple[float, bool]], drop_t: float, end_t: float) -> float | None:
    """Seconds from ``drop_t`` to the start of the first 1 s window (stepped by 50 ms, the last
    ending by ``end_t``) from which every window's 429 share is below 5 %; None when that start
    is less than 2 s before ``end_t`` (or there is no window at all)."""
    starts = [
        drop_t + k * WINDOW_STEP_S
        for k in range(int((end_t - WINDOW_S - drop_t) / WINDOW_STEP_S) + 1)
    ]
    if not starts:
        return None
    bad = [a for a in starts if _window_share(events, a) >= RECOVERED_SHARE]
    good_from = drop_t if not bad else bad[-1] + WINDOW_STEP_S
    if end_t - good_from < 2 * WINDOW_S:
        return None
    return good_from - drop_t


def _window_share(events: list[tuple[float, bool]], start: float) -> float:
    window = [ok for t, ok in events if start <= t < start + WINDOW_S]
    return 0.0 if not window else sum(not ok for ok in window) / len(window)


def table(rows: list[dict[str, Any]], p: Params) -> str:
    header = [
        "system", "calls", "429 share (before / after drop)", "goodput ÷ limit (before / after)",
        "completed", "peak calls/s", "recovery after drop",
    ]  # fmt: skip
    cells = [
        [
            r["system"],
            str(r["calls"]),
            f"{_pct(r['share_429'])} "
            f"({_pct(r['share_429_before'])} / {_pct(r['share_429_after'])})",
            f"{r['goodput']:.2f} ({r['goodput_before']:.2f} / {r['goodput_after']:.2f})",
            f"{r['completed']}/{p.tasks}"
            + (f" ({r['duplicates']} dup)" if r["duplicates"] else ""),
            str(r["peak_calls_per_s"]),
            "no" if r["recovery_s"] is None else f"{r['recovery_s']:.2f} s",
        ]
        for r in rows
    ]
    return markdown_table(header, cells, "lrrrrrr")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seconds", type=float, help="run length T (default 20, --quick 8)")
    parser.add_argument("--quick", action="store_true", help=f"T = {QUICK_SECONDS:g} s")
    parser.add_argument("--rate", type=float, default=10.0, help="the server's real limit R/s")
    parser.add_argument("--burst", type=float, default=5.0, help="the server's bucket size B")
    parser.add_argument("--believed-rate", type=float, help="what users configure (1.5 x R)")
    parser.add_argument("--drop", type=float, default=0.5, help="limit at T/2, times R")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--tasks", type=int, help="backlog (default: never runs out)")
    parser.add_argument("--retry-after", choices=("seconds", "date"), default="seconds")
    parser.add_argument("--adaptive", default="true", help="JSON: the queue's adaptive value")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    seconds = args.seconds or (QUICK_SECONDS if args.quick else 20.0)
    believed = args.believed_rate or 1.5 * args.rate
    systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"--systems: unknown {', '.join(unknown)}; known: {', '.join(SYSTEMS)}")
    # Completions never pass the server's limit: 1.5 x the faster of the two rates is plenty.
    tasks = args.tasks or math.ceil(1.5 * max(args.rate, believed) * seconds + args.burst)
    p = Params(
        seconds, args.rate, args.burst, believed, args.drop, args.workers, tasks,
        args.retry_after, json.loads(args.adaptive),
    )  # fmt: skip
    skipped = []
    why = throttled_missing() if "celery_interval_throttled" in systems else None
    if why:
        note(f"celery_interval_throttled skipped: {why}")
        skipped.append({"system": "celery_interval_throttled", "reason": why})
        systems.remove("celery_interval_throttled")
    note(machine_line())
    rows = []
    with recorder_server() as recorder_url:
        for name in systems:
            note(f"{name}: {tasks} tasks, {seconds:g} s, {args.workers} workers x {CONCURRENCY}")
            row = run_one(name, recorder_url, p)
            note(f"  {json.dumps(row)}")
            rows.append(row)
    if args.json:
        print(json.dumps({"results": rows, "skipped": skipped, "params": asdict(p)}))
        return
    print(
        f"{machine_line()}; {args.workers} workers x {CONCURRENCY} executors, T = {seconds:g} s, "
        f"server limit {args.rate:g}/s burst {args.burst:g}, dropped to "
        f"{args.rate * args.drop:g}/s at T/2; users believe {believed:g}/s; "
        f"Retry-After in {args.retry_after}\n"
    )
    print(table(rows, p))
    for s in skipped:
        print(f"\n{s['system']} skipped: {s['reason']}")


if __name__ == "__main__":
    main()
