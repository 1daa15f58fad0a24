"""CPU and Redis commands per task as workers and buckets grow: IntervalTask against plain Celery.

Run: python bench/scaling.py [--workers 1,2,4] [--buckets 1,100,10000] [--tasks 2000]
[--rounds 2] [--interval 0.001] [--json]

For each worker count W both systems start W ``celery worker`` processes (prefork 2) once, each
system on a Redis broker of its own and IntervalTask on a store of its own, so each server's
INFO commandstats hold only that system's traffic. Every task carries a tenant key: IntervalTask
gives each key its own bucket (``interval_bucket``, bucket ``bench:<key>``, each at
``--interval``; 100 µs is 10,000 starts a second, more than this pool reaches); the plain task
takes the same arguments and runs without celery_interval. A round writes N messages, the keys
k0..k(B-1) in turn (the next round goes on where it stopped), to a staging list of the broker
and RENAMEs it onto the queue: the workers find the whole backlog at once and no producer shares
the CPU with them. It waits until all N have started and the workers are quiet, then reads the
CPU of the workers' process trees (psutil), the commands each redis-server ran (the bench's
RENAME and INFO excluded) and the starts per second. The two systems alternate within each
(W, B) cell.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psutil
import redis
from harness import (
    ProcessGroups,
    Servers,
    commands_served,
    cpu_s,
    machine_line,
    markdown_table,
    note,
    recorder_server,
    wait_ready,
    wait_started,
    worker_env,
)
from recording import ENV_TASK, QUEUE, READY_KEY, STARTS_KEY
from systems import CONCURRENCY, _celery_worker

from celery_interval.demo.app import make_app
from celery_interval.demo.embedded import RedisProc
from celery_interval.headers import SEND_HEADER
from celery_interval.stores.functions import SCRIPT_COMMANDS

SYSTEMS = {"plain": "bench.plain_tenant", "interval": "bench.tenant"}
STAGE_KEY = "bench-stage"
#: After a round's last start: its last bodies end, their acks and done marks go out.
QUIET_S = 0.3


@dataclass
class Running:
    """One system's long-lived workers, its broker and its store."""

    name: str
    servers: Servers
    groups: ProcessGroups
    template: dict[str, Any]

    @property
    def broker(self) -> redis.Redis:
        assert self.servers.broker is not None
        return redis.Redis.from_url(self.servers.broker.url_for(1))

    def _redis_procs(self) -> list[psutil.Process]:
        procs = [self.servers.measured.proc]
        if self.servers.broker is not None:
            procs.append(self.servers.broker.proc)
        return [psutil.Process(p.pid) for p in procs if p is not None]

    def _costs(self) -> tuple[float, float, int, int, int]:
        """Worker CPU s, both redis-servers' CPU s, broker commands, store commands, scripts."""
        store = commands_served(self.servers.measured_client())
        return (
            cpu_s(self.groups.processes()),
            cpu_s(self._redis_procs()),
            commands_served(self.broker).total(),
            store.total(),
            sum(store[c] for c in SCRIPT_COMMANDS),
        )

    def round(self, tasks: int, buckets: int, first: int, timeout_s: float) -> dict[str, float]:
        """N tasks over ``buckets`` keys (from key ``first``) as one backlog; what they cost
        per task."""
        recorder = self.servers.recorder
        recorder.delete(STARTS_KEY)
        broker = self.broker
        if broker.llen(QUEUE):
            raise RuntimeError(f"{self.name}: queue {QUEUE!r} not empty before a round")
        pipe = broker.pipeline(transaction=False)
        for payload in staged(self.template, tasks, buckets, first):
            pipe.lpush(STAGE_KEY, payload)
        pipe.execute()
        before = self._costs()
        began = time.monotonic()
        broker.rename(STAGE_KEY, QUEUE)
        wait_started(recorder, tasks, deadline=began + timeout_s)
        records = [json.loads(r) for r in recorder.lrange(STARTS_KEY, 0, -1)]
        time.sleep(QUIET_S)
        after = self._costs()
        started = len({r["id"] for r in records})
        mono = sorted(r["mono_ns"] / 1e9 for r in records)
        span_s = mono[-1] - mono[0] if len(mono) > 1 else float("nan")
        per = max(1, started)
        return {
            "started": started,
            "duplicates": len(records) - started,
            "worker_cpu_ms": (after[0] - before[0]) / per * 1e3,
            "redis_cpu_ms": (after[1] - before[1]) / per * 1e3,
            "broker_commands": (after[2] - before[2] - 1) / per,  # the RENAME
            "store_commands": (after[3] - before[3]) / per,
            "script_calls": (after[4] - before[4]) / per,
            "tasks_per_s": (len(mono) - 1) / span_s if span_s > 0 else float("nan"),
        }


def staged(template: dict[str, Any], tasks: int, buckets: int, first: int) -> list[str]:
    """Copies of the template message (kombu's Redis payload), one per task, the keys
    ``k<(first + i) % B>``."""
    _args, kwargs, embed = json.loads(base64.b64decode(template["body"]))
    payloads = []
    for i in range(tasks):
        key = f"k{(first + i) % buckets}"
        task_id = str(uuid.uuid4())
        message = copy.deepcopy(template)
        headers = message["headers"]
        headers.update(id=task_id, root_id=task_id, argsrepr=repr((key, i)))
        if SEND_HEADER in headers:
            headers[SEND_HEADER] = os.urandom(4).hex()
        body = json.dumps([[key, i], kwargs, embed]).encode()
        message["body"] = base64.b64encode(body).decode()
        message["properties"].update(correlation_id=task_id, delivery_tag=str(uuid.uuid4()))
        payloads.append(json.dumps(message))
    return payloads


def capture_template(servers: Servers, task: str, interval_s: float) -> dict[str, Any]:
    """One real message of ``task`` as Celery sends it, taken off the queue before any worker
    runs."""
    app = make_app(servers.broker_url, servers.store_url, QUEUE, interval_s)
    app.send_task(task, args=("k0", 0))
    assert servers.broker is not None
    raw = redis.Redis.from_url(servers.broker.url_for(1)).rpop(QUEUE)
    if raw is None:
        raise RuntimeError(f"the template message of {task} did not reach list {QUEUE!r}")
    return dict(json.loads(raw))


def run_workers(
    workers: int, buckets: list[int], tasks: int, rounds: int, interval_s: float, timeout_s: float
) -> list[dict[str, Any]]:
    """Every bucket count's rounds on W workers of each system; one row per (system, B, round)."""
    rows: list[dict[str, Any]] = []
    with recorder_server() as recorder_url, contextlib.ExitStack() as stack:
        redis.Redis.from_url(recorder_url).delete(STARTS_KEY, READY_KEY)
        running: dict[str, Running] = {}
        for name, task in SYSTEMS.items():
            store = stack.enter_context(RedisProc(unix_socket=True))
            broker = stack.enter_context(RedisProc(unix_socket=True))
            servers = Servers(store, recorder_url, broker)
            template = capture_template(servers, task, interval_s)
            groups = ProcessGroups()
            stack.callback(groups.stop)
            groups.start(
                [_celery_worker(n) for n in range(workers)],
                worker_env(servers, interval_s, **{ENV_TASK: task}),
            )
            running[name] = Running(name, servers, groups, template)
        recorder = redis.Redis.from_url(recorder_url)
        for r in running.values():
            wait_ready(r.groups, recorder, len(SYSTEMS) * workers * (CONCURRENCY + 1), 120)
        time.sleep(0.5)  # let every consumer settle into its fetch loop
        for r in running.values():  # warm-up, not counted: first-use costs
            r.round(min(tasks, 500), buckets[0], 0, timeout_s)
        for n_buckets in buckets:
            for n in range(rounds):
                order = list(running) if n % 2 == 0 else list(running)[::-1]
                for name in order:
                    row = running[name].round(tasks, n_buckets, n * tasks, timeout_s)
                    row |= {"system": name, "workers": workers, "buckets": n_buckets}
                    rows.append(row)
                    note(json.dumps(row))
        for r in running.values():  # a failed run keeps them
            stack.callback(r.groups.remove_logs)
    return rows


def cell(rows: list[dict[str, Any]], system: str, workers: int, buckets: int) -> dict[str, float]:
    """A (system, W, B) cell over its rounds: per-task figures weighted by tasks started."""
    runs = [
        r for r in rows if (r["system"], r["workers"], r["buckets"]) == (system, workers, buckets)
    ]
    started = sum(r["started"] for r in runs)
    keys = ("worker_cpu_ms", "redis_cpu_ms", "broker_commands", "store_commands", "script_calls")
    out = {k: sum(r[k] * r["started"] for r in runs) / max(1, started) for k in keys}
    out["tasks_per_s"] = sorted(r["tasks_per_s"] for r in runs)[len(runs) // 2]
    return out


def table(rows: list[dict[str, Any]], tasks: int) -> str:
    header = ["workers", "buckets", "worker CPU ms/task plain", "IntervalTask", "ratio",
              "store cmds/task (scripts)", "broker cmds/task plain", "IntervalTask",
              "Redis CPU ms/task plain", "IntervalTask", "tasks/s plain", "IntervalTask",
              "started"]  # fmt: skip
    body = []
    for w, b in dict.fromkeys((r["workers"], r["buckets"]) for r in rows):
        p, i = cell(rows, "plain", w, b), cell(rows, "interval", w, b)
        runs = [r for r in rows if (r["workers"], r["buckets"]) == (w, b)]
        started = f"{min(r['started'] for r in runs)}/{tasks}"
        body.append([
            str(w), f"{b:,}", f"{p['worker_cpu_ms']:.2f}", f"{i['worker_cpu_ms']:.2f}",
            f"{i['worker_cpu_ms'] / p['worker_cpu_ms']:.2f}x",
            f"{i['store_commands']:.1f} ({i['script_calls']:.2f})",
            f"{p['broker_commands']:.1f}", f"{i['broker_commands']:.1f}",
            f"{p['redis_cpu_ms']:.3f}", f"{i['redis_cpu_ms']:.3f}",
            f"{p['tasks_per_s']:.0f}", f"{i['tasks_per_s']:.0f}", started,
        ])  # fmt: skip
    return markdown_table(header, body, "rrrrrrrrrrrrr")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,2,4", help="worker processes (prefork 2 each)")
    parser.add_argument("--buckets", default="1,100,10000", help="tenant buckets")
    parser.add_argument("--tasks", type=int, default=2000, help="tasks per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per system and cell")
    parser.add_argument("--interval", type=float, default=0.0001, help="seconds per bucket")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per round")
    parser.add_argument("--json", action="store_true", help="print the rounds as JSON")
    args = parser.parse_args(argv)
    buckets = [int(x) for x in args.buckets.split(",")]
    started_at = machine_line()
    note(started_at)
    rows: list[dict[str, Any]] = []
    for workers in (int(x) for x in args.workers.split(",")):
        rows += run_workers(workers, buckets, args.tasks, args.rounds, args.interval, args.timeout)
    if args.json:
        print(json.dumps(rows))
        return
    print(
        f"{started_at} (at the start); {machine_line()} (at the end); {args.rounds} rounds of "
        f"{args.tasks} tasks per system and cell, interval {args.interval:g} s per bucket\n"
    )
    print(table(rows, args.tasks))


if __name__ == "__main__":
    main()
