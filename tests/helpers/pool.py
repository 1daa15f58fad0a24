"""Real ``celery worker`` processes for multi-worker tests, and readers of what they recorded."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from celery_interval.config import settings_of
from celery_interval.testing.processes import WorkerProcess as Worker
from tests.helpers.workerapp import make_app

HELPERS_DIR = Path(__file__).resolve().parent
#: The repository root: the workers' cwd and PYTHONPATH, so ``-A tests.helpers.workerapp`` imports.
ROOT_DIR = HELPERS_DIR.parents[1]


@dataclass
class Pool:
    """N real workers consuming one interval queue, configured through environment variables."""

    broker: str
    store: str
    interval_s: float
    tmp: Path
    queue: str = field(default_factory=lambda: f"q{uuid.uuid4().hex[:10]}")
    conf: dict[str, Any] = field(default_factory=dict)
    env_extra: dict[str, str] = field(default_factory=dict)
    workers: list[Worker] = field(default_factory=list)
    loglevel: str = "WARNING"
    #: Where tasks record their starts (default: the store's Redis).
    record_url: str = ""
    #: The module ``celery -A`` loads (``faultapp`` adds fault hooks to ``workerapp``).
    app_module: str = "tests.helpers.workerapp"
    #: A process beside the workers that waits for deadlines as a pool process does (wakeprobe).
    probe: subprocess.Popen[bytes] | None = None
    #: The app factory of ``app_module`` (the same settings as the workers' app).
    app_factory: Callable[..., Any] = make_app
    stopped: bool = False
    #: Store-clock µs until which a copy a killed worker held may still start elsewhere (its
    #: death, then the lease, then a Redis broker's redelivery): strays are awaited until then.
    strays_until_us: int = 0
    #: The ids ``send`` enqueued, in order: a wait that times out names those that never ran.
    sent: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # The pool's own remote-control exchange: its broadcasts reach its workers only, and a
        # worker another test left behind never answers this one's (a shared RabbitMQ vhost).
        self.conf.setdefault("control_exchange", f"celery-{self.queue}")
        factory = self.app_factory
        self.app = factory(self.broker, self.store, self.queue, self.interval_s, **self.conf)
        self.recorder = redis.Redis.from_url(self.record_url or self.store)
        self.probe_path = self.tmp / f"{self.queue}.wakeprobe"

    def wake_noise(self, since_ns: int, until_ns: int, late_us: int) -> tuple[int, int]:
        """(late, all) wakes of the probe between two monotonic times: how many were later
        than ``late_us`` while the workers ran, on this machine, without Celery."""
        late = total = 0
        with contextlib.suppress(FileNotFoundError):
            for line in self.probe_path.read_text().splitlines():
                deadline_ns, late_ns = map(int, line.split())
                if since_ns <= deadline_ns <= until_ns:
                    total += 1
                    late += late_ns > late_us * 1000
        return late, total

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            CI_TEST_BROKER=self.broker,
            CI_TEST_STORE=self.store,
            CI_TEST_QUEUE=self.queue,
            CI_TEST_INTERVAL=str(self.interval_s),
            CI_TEST_CONF=json.dumps(self.conf),
            CI_TEST_RECORD=self.record_url,
            PYTHONPATH=os.pathsep.join([str(ROOT_DIR), env.get("PYTHONPATH", "")]),
            **self.env_extra,
        )
        return env

    def start(
        self,
        n: int = 3,
        concurrency: int = 2,
        pool: str = "prefork",
        queues: str = "",
        args: tuple[str, ...] = (),
        **env: str,
    ) -> list[Worker]:
        """Start ``n`` workers and wait until each answers a ping."""
        if self.probe is None and 0 < self.interval_s < math.inf:  # not for a refused interval
            self.probe = subprocess.Popen(
                [
                    sys.executable,
                    str(HELPERS_DIR / "wakeprobe.py"),
                    str(self.probe_path),
                    str(round(self.interval_s * 1e6)),
                ],
                cwd=ROOT_DIR,
                env=self.env(),
            )
        started = [self._spawn(concurrency, pool, queues, args, env) for _ in range(n)]
        self.wait_ready([w.name for w in started])
        return started

    def _spawn(
        self, concurrency: int, pool: str, queues: str, args: tuple[str, ...], env: dict[str, str]
    ) -> Worker:
        name = f"w{len(self.workers) + 1}-{self.queue}@localhost"
        log_path = self.tmp / f"{name}.log"
        cmd = [
            sys.executable, "-m", "celery", "-A", self.app_module, "worker",
            "-Q", queues or f"{self.queue},{self.queue}-plain",
            "-c", str(concurrency), "-P", pool, "-n", name, "-l", self.loglevel, *args,
            "--without-gossip", "--without-mingle",
        ]  # fmt: skip
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                cmd, cwd=ROOT_DIR, env={**self.env(), **env}, stdout=log, stderr=subprocess.STDOUT
            )
        worker = Worker(name, proc, log_path)
        self.workers.append(worker)
        return worker

    def wait_ready(self, names: list[str], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        pending = set(names)
        while pending and time.monotonic() < deadline:
            for w in self.workers:
                if w.name in pending and w.proc.poll() is not None:
                    raise RuntimeError(f"worker {w.name} exited early:\n{w.log()[-3000:]}")
            try:
                replies = self.app.control.ping(destination=list(pending), timeout=0.5) or []
            except (OSError, *self.app.connection_for_write().connection_errors):
                time.sleep(0.2)  # a broker connection reset: ask again
                continue
            for reply in replies:
                pending -= set(reply)
        if pending:
            logs = "\n".join(w.log()[-2000:] for w in self.workers if w.name in pending)
            raise RuntimeError(f"workers not ready after {timeout_s}s: {pending}\n{logs}")

    def send(self, n: int, task: str = "workerapp.record", **kwargs: Any) -> list[str]:
        """Enqueue ``n`` tasks with args ``(i,)`` up front; returns their ids in order."""
        ids = []
        with self.app.producer_or_acquire() as producer:
            for i in range(n):
                result = self.app.send_task(
                    task, args=(i,), kwargs=kwargs, queue=self.queue, producer=producer
                )
                ids.append(result.id)
        self.sent.extend(ids)
        return ids

    def store_now_us(self) -> int:
        """Now on the recorder's Redis clock (the store's, where they are one server)."""
        seconds, micros = self.recorder.time()
        return int(seconds) * 1_000_000 + int(micros)

    def records(self) -> list[dict[str, Any]]:
        raw = self.recorder.lrange(f"record:{self.queue}", 0, -1)
        return [json.loads(r) for r in raw]

    def wait_records(
        self, count: int, kind: str = "start", timeout_s: float = 120.0
    ) -> list[dict[str, Any]]:
        """Wait until ``count`` records of ``kind`` exist, then for strays: five intervals, and
        after a kill until every copy the killed worker held could have started elsewhere
        (``strays_until_us``), so a copy run twice after its lease shows here."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = [r for r in self.records() if r["kind"] == kind]
            if len(got) >= count:
                time.sleep(max(0.5, 5 * self.interval_s))
                while self.store_now_us() < self.strays_until_us:
                    time.sleep(0.2)
                return [r for r in self.records() if r["kind"] == kind]
            time.sleep(0.1)
        got = [r for r in self.records() if r["kind"] == kind]
        self.print_missing({r["id"] for r in got})
        raise AssertionError(f"only {len(got)} of {count} {kind} records after {timeout_s}s")

    def print_missing(self, seen: set[str]) -> None:
        """For each id sent that has no record: its ledger entries and its workers' log lines
        (printed whole: an assertion's message is cut short)."""
        from tests.helpers.ledgers import ledger_entries  # it imports this module

        try:
            entries = ledger_entries(self.recorder, self.queue)
        except redis.RedisError as exc:  # the store may be down: the logs still say something
            print(f"no ledger: {exc}")
            entries = []
        for task_id in [i for i in self.sent if i not in seen]:
            print(f"never ran: {task_id}")
            for fields in entries:
                if fields.get("task") == task_id:
                    print("  ledger", fields)
            for log in sorted(self.tmp.glob("*.log")):
                for line in log.read_text(errors="replace").splitlines():
                    if task_id in line:
                        print(f"  {log.name}: {line}")

    def kill(self, worker: Worker, sig: int = signal.SIGKILL) -> tuple[int, int]:
        """Kill a worker's whole process group member by member (prefork children too); returns
        the store-clock µs just before the first signal and after the worker's death: the
        worker may admit starts until the end of that window, on a loaded machine 0.1 s on."""
        first_us = self.store_now_us()
        try:
            children = subprocess.run(
                ["pgrep", "-P", str(worker.proc.pid)], capture_output=True, text=True
            ).stdout.split()
        except FileNotFoundError:
            children = []
        worker.proc.send_signal(sig)
        for pid in children:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), sig)
        worker.proc.wait(timeout=30)
        dead_us = self.store_now_us()
        self.strays_until_us = max(self.strays_until_us, dead_us + self._redelivery_us())
        return first_us, dead_us

    def _redelivery_us(self) -> int:
        """How long after a kill a copy the worker held may start elsewhere: its lease, plus a
        Redis broker's visibility timeout when short enough for a test to see (the default,
        an hour, returns nothing within any test)."""
        lease_s = settings_of(self.app).lease_us / 1e6
        options = self.app.conf.broker_transport_options or {}
        visibility_s = float(options.get("visibility_timeout", 0.0))
        redelivery_s = visibility_s if self.broker.startswith("redis") and visibility_s <= 60 else 0
        return round((lease_s + redelivery_s + 1.0) * 1e6)

    def stop(self) -> None:
        """Stop the workers and delete the queues (once: a test may stop it before its broker)."""
        if self.stopped:
            return
        self.stopped = True
        if self.probe is not None and self.probe.poll() is None:
            self.probe.terminate()
            self.probe.wait(timeout=10)
        self.probe = None
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in self.workers:
            try:
                w.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill(w)
        try:
            with self.app.connection_for_write() as conn:
                for q in (self.queue, f"{self.queue}-plain"):
                    with contextlib.suppress(Exception):
                        conn.default_channel.queue_delete(q)
        except Exception:
            pass


def run_once(pool: Pool, n: int) -> tuple[list[str], list[dict[str, Any]]]:
    """One worker (-c 2) on a fresh recorder runs ``n`` tasks; returns their ids and starts."""
    try:
        pool.recorder.flushdb()
        pool.start(1, concurrency=2)
        ids = pool.send(n)
        records = pool.wait_records(n)
    finally:
        pool.stop()
    return ids, records


def gaps_us(records: list[dict[str, Any]]) -> list[int]:
    """Gaps between body starts on this host's CLOCK_MONOTONIC (shared by every worker here)."""
    times = sorted(r["mono_ns"] // 1000 for r in records)
    return [b - a for a, b in itertools.pairwise(times)]


def celery_cli(pool: Pool, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run the real ``celery -A workerapp …`` command line against the pool's app."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.helpers.workerapp", *args],
        cwd=ROOT_DIR,
        env=pool.env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
