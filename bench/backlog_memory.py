"""Bounded memory: a 200,000-message backlog at a long interval; worker RSS must stay flat.

Run: python bench/backlog_memory.py [--backlog 200000] [--interval 0.2] [--seconds 60]
[--workers 3] [--json].
W workers x prefork 2 start on an empty IntervalTask queue (the idle sample), then the backlog
goes into the Redis broker (one real Celery message, then copies of it with fresh task ids,
args and delivery tags: sending 200,000 through Celery's producer takes minutes here). Every
few seconds the bench samples the RSS of every worker process (mains and pool children), the
messages still queued and those delivered but unacked (held or running). A worker holds about
``interval_hold_ahead_s`` of the bucket's pace and parks the rest in the bucket's overflow queue,
so RSS and unacked stay flat while the workers take the whole backlog from the queue.
"""

from __future__ import annotations

import argparse
import base64
import json
import time
import uuid
from typing import Any

import redis
from harness import (
    ProcessGroups,
    Servers,
    machine_line,
    markdown_table,
    measured_server,
    note,
    recorder_server,
    rss_bytes,
    wait_ready,
)
from recording import QUEUE, STARTS_KEY
from systems import build

from celery_interval.demo.app import make_app

UNACKED_KEY = "unacked"  # kombu's Redis transport: delivered, not yet acked
TEMPLATE_QUEUE = "bench-template"
BATCH = 5_000


def fill_backlog(servers: Servers, count: int, interval_s: float) -> None:
    """``count`` IntervalTask messages in the broker: copies of one that Celery sent aside."""
    app = make_app(servers.broker_url, servers.store_url, QUEUE, interval_s)
    app.send_task("bench.interval", args=(0,), queue=TEMPLATE_QUEUE)
    broker = redis.Redis.from_url(servers.measured.url_for(1))
    raw = broker.rpop(TEMPLATE_QUEUE)
    if not isinstance(raw, bytes):
        raise RuntimeError(f"no template message in the broker's {TEMPLATE_QUEUE!r} list")
    template = json.loads(raw)
    template["properties"]["delivery_info"]["routing_key"] = QUEUE
    _args, kwargs, embed = json.loads(base64.b64decode(template["body"]))
    for start in range(0, count, BATCH):
        pipe = broker.pipeline(transaction=False)
        for i in range(start, min(count, start + BATCH)):
            task_id = str(uuid.uuid4())
            body = json.dumps([[i], kwargs, embed]).encode()
            message = {
                **template,
                "body": base64.b64encode(body).decode(),
                "headers": {**template["headers"], "id": task_id, "root_id": task_id,
                            "argsrepr": f"({i},)"},
                "properties": {**template["properties"], "correlation_id": task_id,
                               "delivery_tag": str(uuid.uuid4())},
            }  # fmt: skip
            pipe.lpush(QUEUE, json.dumps(message))
        pipe.execute()


def sample(groups: ProcessGroups, servers: Servers, began: float) -> dict[str, Any]:
    broker = redis.Redis.from_url(servers.measured.url_for(1))
    processes = groups.processes()
    roots = {p.pid for p in groups.processes() if p.pid in {q.pid for q in groups.procs}}
    return {
        "t_s": round(time.monotonic() - began, 1),
        "worker_rss_mb": rss_bytes(processes) / 2**20,
        "main_rss_mb": rss_bytes([p for p in processes if p.pid in roots]) / 2**20,
        "queued": int(broker.llen(QUEUE)),
        "unacked": int(broker.hlen(UNACKED_KEY)),
        "started": int(servers.recorder.llen(STARTS_KEY)),
        "redis_used_mb": int(broker.info("memory")["used_memory"]) / 2**20,
    }


def measure(backlog: int, interval_s: float, seconds: float, workers: int) -> dict[str, Any]:
    """Idle workers first (the baseline sample), then the backlog, then samples over time."""
    with recorder_server() as recorder_url, measured_server(recorder_url) as servers:
        system = build("celery_interval", servers, interval_s, workers)
        groups = ProcessGroups()
        try:
            groups.start(system.commands, system.env)
            wait_ready(groups, servers.recorder, system.ready_count, timeout_s=90)
            time.sleep(1.0)
            began = time.monotonic()
            samples = [sample(groups, servers, began)]
            note(f"  idle: {json.dumps(samples[-1])}")
            fill_backlog(servers, backlog, interval_s)
            note(f"backlog of {backlog:,} sent in {time.monotonic() - began:.1f}s")
            while True:
                samples.append(sample(groups, servers, began))
                note(f"  {json.dumps(samples[-1])}")
                if time.monotonic() - began >= seconds:
                    break
                time.sleep(min(5.0, seconds / 10))
        finally:
            groups.stop()
        groups.remove_logs()
    first, last = samples[0], samples[-1]
    loaded = samples[1]
    return {
        "backlog": backlog,
        "interval_s": interval_s,
        "workers": workers,
        "seconds": seconds,
        "samples": samples,
        "worker_rss_idle_mb": first["worker_rss_mb"],
        "worker_rss_start_mb": loaded["worker_rss_mb"],
        "worker_rss_end_mb": last["worker_rss_mb"],
        "worker_rss_max_mb": max(s["worker_rss_mb"] for s in samples),
        "max_unacked": max(s["unacked"] for s in samples),
        "taken_from_queue": backlog - last["queued"],
        "queued_end": last["queued"],
        "started": last["started"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backlog", type=int, default=200_000)
    parser.add_argument("--interval", type=float, default=0.2, help="seconds")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to watch")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    note(machine_line())
    r = measure(args.backlog, args.interval, args.seconds, args.workers)
    if args.json:
        print(json.dumps(r))
        return
    print(
        f"{machine_line()}; backlog {r['backlog']:,} at {r['interval_s']:g} s, "
        f"{r['workers']} workers x prefork 2\n"
    )
    rows = [
        [
            f"{s['t_s']:g}",
            f"{s['worker_rss_mb']:.1f}",
            f"{s['main_rss_mb']:.1f}",
            f"{s['queued']:,}",
            f"{s['unacked']:,}",
            f"{s['started']:,}",
            f"{s['redis_used_mb']:.0f}",
        ]
        for s in r["samples"]
    ]
    header = ["t (s)", "worker RSS MB (all)", "of which mains", "queued", "unacked (held)",
              "started", "broker used MB"]  # fmt: skip
    print(markdown_table(header, rows, "rrrrrrr"))
    print(
        f"\nworker RSS {r['worker_rss_idle_mb']:.1f} MB idle, {r['worker_rss_start_mb']:.1f} MB "
        f"once the backlog was in, {r['worker_rss_end_mb']:.1f} MB after {r['seconds']:g} s "
        f"(max {r['worker_rss_max_mb']:.1f}); at most "
        f"{r['max_unacked']:,} messages unacked; {r['taken_from_queue']:,} of {r['backlog']:,} "
        f"taken from the queue, {r['started']:,} started"
    )


if __name__ == "__main__":
    main()
