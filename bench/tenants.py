"""Tenants on one queue: a new key's first start behind another key's backlog, and worker RSS
and store memory over a million tasks on thousands of keys.

Run:
  python bench/tenants.py latency [--broker redis|rabbitmq] [--backlog 100000] [--new-keys 200]
  python bench/tenants.py memory [--tasks 1000000] [--keys 10000] [--seconds 300]

``latency``: W workers x prefork 2 on one IntervalTask queue, one bucket per key. The backlog of
key ``flood`` (interval ``--interval``) goes into the broker first; once the workers have taken
all of it from the queue (held or parked), ``--new-keys`` keys send one task each, one every
``--every`` seconds, through Celery's producer. Reported: each new key's first start after its
send (p50, p99, max; one host clock), the flood's starts in that window (utilization, smallest
gap, from the store's ledger), and the time the workers took to take the backlog.

``memory``: ``--tasks`` tasks over ``--keys`` keys (interleaved, interval 1 s each) go into a
Redis broker; the bench samples the workers' RSS (mains and pool children), the store's
``used_memory`` (a redis-server of its own), the queue, the overflow index and the starts.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kombu
import redis
from harness import (
    BENCH_DIR,
    ProcessGroups,
    machine_line,
    markdown_table,
    note,
    publish_copy,
    rss_bytes,
)
from recording import (
    ENV_BROKER,
    ENV_CONF,
    ENV_INTERVAL,
    ENV_RATE_LIMIT,
    ENV_RECORD,
    ENV_STORE,
    ENV_TASK,
    QUEUE,
    READY_KEY,
    STARTS_KEY,
)

from celery_interval.config.table import KEY_PREFIX
from celery_interval.demo.app import make_app
from celery_interval.demo.embedded import RedisProc
from celery_interval.stores.keys import ledger_key

RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"
TEMPLATE_QUEUE = "bench-tenant-template"
CONCURRENCY = 2
TASK = "bench.tenant"


@dataclass(frozen=True)
class Run:
    broker_url: str
    store: RedisProc
    recorder_url: str
    interval_s: float

    @property
    def recorder(self) -> redis.Redis:
        return redis.Redis.from_url(self.recorder_url)

    def app(self) -> Any:
        return make_app(self.broker_url, self.store.url, QUEUE, self.interval_s)


@contextlib.contextmanager
def servers(broker: str, interval_s: float) -> Iterator[Run]:
    """A store and a recorder of their own; the broker is a redis-server of its own, or the
    local RabbitMQ (its bench queues are deleted after the run)."""
    with RedisProc(unix_socket=True) as store, RedisProc(unix_socket=True) as rec:
        if broker == "redis":
            with RedisProc() as broker_proc:
                yield Run(broker_proc.broker_url_for(1), store, rec.url, interval_s)
        else:
            run = Run(RABBITMQ_URL, store, rec.url, interval_s)
            try:
                yield run
            finally:
                delete_bench_queues(run)


def delete_bench_queues(run: Run) -> None:
    with kombu.Connection(run.broker_url) as conn:
        channel = conn.channel()
        names = [QUEUE, TEMPLATE_QUEUE, f"ci-overflow:{QUEUE}:flood"]
        names += [f"ci-overflow:{QUEUE}:new{k}" for k in range(1000)]
        for name in names:
            channel.queue_delete(name)


def start_workers(run: Run, workers: int, conf: dict[str, Any]) -> ProcessGroups:
    env = dict(os.environ)
    env.update(
        {
            ENV_BROKER: run.broker_url,
            ENV_STORE: run.store.url,
            ENV_RECORD: run.recorder_url,
            ENV_INTERVAL: repr(run.interval_s),
            ENV_RATE_LIMIT: "",
            ENV_TASK: TASK,
            ENV_CONF: json.dumps(conf),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(BENCH_DIR), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
    )
    commands = [
        [
            sys.executable, "-m", "celery", "-A", "workload_celery", "worker", "-Q", QUEUE,
            "-P", "prefork", "-c", str(CONCURRENCY), "-n", f"w{n + 1}@bench", "-l", "WARNING",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]
        for n in range(workers)
    ]  # fmt: skip
    groups = ProcessGroups()
    groups.start(commands, env)
    deadline = time.monotonic() + 90
    while run.recorder.llen(READY_KEY) < workers * (1 + CONCURRENCY):
        groups.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers not ready; logs in {groups.log_dir}")
        time.sleep(0.2)
    return groups


def template(run: Run) -> kombu.Message:
    """One real message of the tenant task, sent by Celery aside (headers, body, properties)."""
    app = run.app()
    app.send_task(TASK, args=("template", 0), queue=TEMPLATE_QUEUE)
    with kombu.Connection(run.broker_url) as conn:
        queue = kombu.Queue(TEMPLATE_QUEUE, kombu.Exchange(TEMPLATE_QUEUE), TEMPLATE_QUEUE)
        message = queue(conn.channel()).get(no_ack=True)
    if message is None:
        raise RuntimeError("the template message did not arrive")
    return message


def fill(run: Run, calls: Iterator[tuple[str, int]]) -> int:
    """Publish copies of the template, one per ``(key, i)``, with fresh ids (faster than
    sending each through Celery's producer); returns how many."""
    message = template(run)
    sent = 0
    with kombu.Connection(run.broker_url) as conn:
        producer = kombu.Producer(conn.channel(), exchange=kombu.Exchange(""))
        for key, i in calls:
            publish_copy(producer, message, QUEUE, [key, i])
            sent += 1
    return sent


def queued(run: Run) -> int:
    """Messages ready in the task queue (a Redis broker has no key for an empty one)."""
    with kombu.Connection(run.broker_url) as conn:
        try:
            declared = conn.channel().queue_declare(QUEUE, passive=True)
        except conn.channel_errors:
            return 0
    return int(declared.message_count)


def starts(run: Run) -> list[dict[str, Any]]:
    return [json.loads(r) for r in run.recorder.lrange(STARTS_KEY, 0, -1)]


def flood_claims_us(run: Run) -> list[int]:
    """Admitted starts of the flood's bucket (store clock), from its ledger."""
    client = redis.Redis.from_url(run.store.url)
    return sorted(
        int(fields[b"start"])
        for _id, fields in client.xrange(ledger_key(KEY_PREFIX, f"{QUEUE}:flood"))
        if fields.get(b"op") == b"claim:OK" and fields.get(b"again") != b"1"
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency(args: argparse.Namespace) -> dict[str, Any]:
    with servers(args.broker, args.interval) as run:
        groups = start_workers(run, args.workers, {})
        try:
            began = time.monotonic()
            fill(run, (("flood", i) for i in range(args.backlog)))
            sent_s = time.monotonic() - began
            note(f"backlog of {args.backlog:,} sent in {sent_s:.1f}s")
            while queued(run) > 0:
                groups.check_alive()
                time.sleep(0.5)
            taken_s = time.monotonic() - began
            note(f"backlog taken from the queue after {taken_s:.1f}s")
            app = run.app()
            window_store_us = store_now_us(run)
            sends: dict[str, int] = {}
            with app.producer_or_acquire() as producer:
                for k in range(args.new_keys):
                    key = f"new{k}"
                    sends[key] = time.monotonic_ns()
                    app.send_task(TASK, args=(key, 0), queue=QUEUE, producer=producer)
                    time.sleep(args.every)
            deadline = time.monotonic() + 60
            firsts: dict[str, int] = {}
            while len(firsts) < len(sends) and time.monotonic() < deadline:
                firsts = {r["key"]: r["mono_ns"] for r in starts(run) if r.get("key") in sends}
                time.sleep(0.2)
            window_end_us = store_now_us(run)
            rss_mb = rss_bytes(groups.processes()) / 2**20
        finally:
            groups.stop()
        groups.remove_logs()
        claims = [t for t in flood_claims_us(run) if window_store_us <= t <= window_end_us]
    waits_s = [(firsts[k] - sends[k]) / 1e9 for k in firsts]
    gaps = [b - a for a, b in itertools.pairwise(claims)]
    return {
        "broker": args.broker,
        "backlog": args.backlog,
        "interval_s": args.interval,
        "workers": args.workers,
        "sent_s": sent_s,
        "taken_s": taken_s,
        "new_keys": args.new_keys,
        "started_keys": len(firsts),
        "first_start_p50_s": statistics.median(waits_s) if waits_s else None,
        "first_start_p99_s": percentile(waits_s, 0.99) if waits_s else None,
        "first_start_max_s": max(waits_s) if waits_s else None,
        "flood_starts_in_window": len(claims),
        "flood_utilization": (len(claims) - 1) * args.interval * 1e6 / (claims[-1] - claims[0])
        if len(claims) > 1
        else None,
        "flood_min_gap_ms": min(gaps) / 1e3 if gaps else None,
        "worker_rss_mb": rss_mb,
    }


def store_now_us(run: Run) -> int:
    seconds, micros = redis.Redis.from_url(run.store.url).time()
    return int(seconds) * 1_000_000 + int(micros)


def memory(args: argparse.Namespace) -> dict[str, Any]:
    with servers("redis", 1.0) as run:
        groups = start_workers(run, args.workers, {})
        store = redis.Redis.from_url(run.store.url)
        samples: list[dict[str, Any]] = []
        began = time.monotonic()

        def sample() -> None:
            samples.append(
                {
                    "t_s": round(time.monotonic() - began, 1),
                    "worker_rss_mb": rss_bytes(groups.processes()) / 2**20,
                    "store_used_mb": int(store.info("memory")["used_memory"]) / 2**20,
                    "store_keys": int(store.dbsize()),
                    "queued": queued(run),
                    "overflow_buckets": int(store.zcard("ci:{~overflow}:due")),
                    "started": int(run.recorder.llen(STARTS_KEY)),
                }
            )
            note(f"  {json.dumps(samples[-1])}")

        done = threading.Event()

        def sample_every_10s() -> None:
            while not done.wait(10.0):
                sample()

        sampler = threading.Thread(target=sample_every_10s, daemon=True)
        try:
            sample()
            sampler.start()
            calls = ((f"k{i % args.keys}", i) for i in range(args.tasks))
            fill(run, calls)
            sent_s = time.monotonic() - began
            note(f"{args.tasks:,} tasks over {args.keys:,} keys sent in {sent_s:.0f}s")
            while time.monotonic() - began < args.seconds:
                groups.check_alive()
                time.sleep(1.0)
        finally:
            done.set()
            sampler.join()
            sample()
            groups.stop()
        groups.remove_logs()
    return {
        "tasks": args.tasks,
        "keys": args.keys,
        "workers": args.workers,
        "seconds": args.seconds,
        "samples": samples,
        "worker_rss_idle_mb": samples[0]["worker_rss_mb"],
        "worker_rss_max_mb": max(s["worker_rss_mb"] for s in samples),
        "store_used_max_mb": max(s["store_used_mb"] for s in samples),
        "started": samples[-1]["started"],
        "queued_end": samples[-1]["queued"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    lat = sub.add_parser("latency")
    lat.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis")
    lat.add_argument("--backlog", type=int, default=100_000)
    lat.add_argument("--interval", type=float, default=0.01, help="seconds, every key")
    lat.add_argument("--new-keys", type=int, default=200)
    lat.add_argument("--every", type=float, default=0.1, help="seconds between new keys")
    lat.add_argument("--workers", type=int, default=2)
    mem = sub.add_parser("memory")
    mem.add_argument("--tasks", type=int, default=1_000_000)
    mem.add_argument("--keys", type=int, default=10_000)
    mem.add_argument("--seconds", type=float, default=300.0, help="how long to watch")
    mem.add_argument("--workers", type=int, default=2)
    for p in (lat, mem):
        p.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    note(machine_line())
    result = latency(args) if args.what == "latency" else memory(args)
    if args.json:
        print(json.dumps(result))
        return
    print(machine_line())
    if args.what == "memory":
        rows = [
            [f"{s['t_s']:g}", f"{s['worker_rss_mb']:.0f}", f"{s['store_used_mb']:.1f}",
             f"{s['store_keys']:,}", f"{s['queued']:,}", f"{s['overflow_buckets']:,}",
             f"{s['started']:,}"]
            for s in result["samples"]
        ]  # fmt: skip
        header = ["t (s)", "worker RSS MB", "store MB", "store keys", "queued",
                  "buckets parked", "started"]  # fmt: skip
        print(markdown_table(header, rows, "rrrrrrr"))
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))


if __name__ == "__main__":
    main()
