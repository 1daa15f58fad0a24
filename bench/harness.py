"""Shared bench machinery: private redis-servers, worker process groups, CPU, commands, figures.

Two redis-servers per bench: the *measured* one (broker in db 1, store or limiter in db 0,
fresh for each run, so its INFO commandstats hold only the system's own traffic) and the
*recorder*, where every worker pushes its body starts (CLOCK_MONOTONIC, shared by every
process on this host) and readiness, and which the bench polls.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

try:
    import psutil
except ImportError as exc:  # a bench-only dependency
    raise SystemExit(f"the benchmarks need psutil ({exc}): pip install psutil") from exc
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
from celery_interval.demo.embedded import RedisProc
from celery_interval.demo.report import RunFigures, figures_from
from celery_interval.stores.functions import SCRIPT_COMMANDS
from celery_interval.stores.keys import ledger_key

BENCH_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Servers:
    """The measured redis-server of one run and the bench's recorder."""

    measured: RedisProc
    recorder_url: str
    #: A redis-server of the broker's own (its commands counted apart), else db 1 of measured.
    broker: RedisProc | None = None

    @property
    def recorder(self) -> redis.Redis:
        return redis.Redis.from_url(self.recorder_url)

    @property
    def broker_url(self) -> str:
        return (self.broker or self.measured).broker_url_for(1)

    @property
    def store_url(self) -> str:
        return self.measured.url_for(0)

    def measured_client(self) -> redis.Redis:
        return redis.Redis.from_url(self.store_url)


@contextlib.contextmanager
def recorder_server() -> Iterator[str]:
    """The recorder redis-server (its URL), one per bench invocation."""
    with RedisProc(unix_socket=True) as proc:
        yield proc.url


@contextlib.contextmanager
def measured_server(recorder_url: str) -> Iterator[Servers]:
    """A fresh measured redis-server for one run; the recorder's lists are emptied."""
    redis.Redis.from_url(recorder_url).delete(STARTS_KEY, READY_KEY)
    with RedisProc(unix_socket=True) as proc:
        yield Servers(proc, recorder_url)


@dataclass(frozen=True)
class System:
    """How one system runs the workload: worker command lines, environment, enqueue."""

    name: str
    #: One command line per process group (a Celery worker, or one ``dramatiq`` master).
    commands: list[list[str]]
    env: dict[str, str]
    #: Ready records expected before the backlog is enqueued.
    ready_count: int
    enqueue: Callable[[Servers, int], None]
    #: Read the bucket's ledger (claims) after the run: celery_interval only.
    has_ledger: bool = False


def worker_env(servers: Servers, interval_s: float, **extra: str) -> dict[str, str]:
    """The environment of every bench worker process."""
    env = dict(os.environ)
    env.update(
        {
            ENV_BROKER: servers.broker_url,
            ENV_STORE: servers.store_url,
            ENV_RECORD: servers.recorder_url,
            ENV_INTERVAL: repr(interval_s),
            ENV_RATE_LIMIT: "",
            ENV_TASK: "",
            ENV_CONF: "{}",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(BENCH_DIR), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
    )
    env.update(extra)
    return env


@dataclass
class ProcessGroups:
    """The worker process groups of one run (each its own session, so ended as a whole)."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ci-bench-")))

    def start(self, commands: Sequence[list[str]], env: dict[str, str]) -> None:
        for n, command in enumerate(commands):
            with open(self.log_dir / f"worker{n + 1}.log", "wb") as log:
                self.procs.append(
                    subprocess.Popen(
                        command,
                        env=env,
                        cwd=BENCH_DIR,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def check_alive(self) -> None:
        for n, proc in enumerate(self.procs):
            if proc.poll() is not None:
                tail = (self.log_dir / f"worker{n + 1}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"bench worker {n + 1} exited ({proc.returncode}):\n{tail}")

    def processes(self) -> list[psutil.Process]:
        """Every live process of every group (the roots and all their descendants)."""
        found: list[psutil.Process] = []
        for proc in self.procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                root = psutil.Process(proc.pid)
                found += [root, *root.children(recursive=True)]
        return found

    def roots(self) -> list[psutil.Process]:
        """The process each command line started (Celery's worker main, Dramatiq's master)."""
        found = []
        for proc in self.procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                found.append(psutil.Process(proc.pid))
        return found

    def remove_logs(self) -> None:
        """Drop the worker logs (after a run that went well; a failed run keeps them)."""
        shutil.rmtree(self.log_dir, ignore_errors=True)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM each group, then SIGKILL what is left after ``grace_s``."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def cpu_s(processes: Sequence[psutil.Process], *, reaped: bool = True) -> float:
    """User + system CPU seconds of ``processes``, with (``reaped``) children they have reaped.

    Differences of two such sums are exact even when a child exits in between: its time moves
    from its own entry into its parent's ``children_*``.
    """
    total = 0.0
    for p in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system + (t.children_user + t.children_system if reaped else 0)
    return total


def rss_bytes(processes: Sequence[psutil.Process]) -> int:
    total = 0
    for p in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


@dataclass(frozen=True)
class Costs:
    """What a system has used so far; the difference of two readings is what it used between."""

    worker_s: float
    #: Of which the process each command started (Celery's worker main, Dramatiq's master).
    main_s: float
    redis_s: float
    commands: Counter[str]

    def __sub__(self, before: Costs) -> Costs:
        return Costs(
            self.worker_s - before.worker_s,
            self.main_s - before.main_s,
            self.redis_s - before.redis_s,
            self.commands - before.commands,
        )


def costs_now(
    groups: ProcessGroups, redis_proc: psutil.Process | None, client: redis.Redis
) -> Costs:
    """CPU seconds of the workers (and of their mains alone) and of redis-server, and the
    commands redis-server has served."""
    return Costs(
        cpu_s(groups.processes()),
        cpu_s(groups.roots(), reaped=False),
        cpu_s([redis_proc]) if redis_proc else 0.0,
        commands_served(client),
    )


def start_times_s(records: Sequence[dict[str, Any]]) -> list[float]:
    """Body starts in seconds on CLOCK_MONOTONIC, sorted."""
    return sorted(r["mono_ns"] / 1e9 for r in records)


def commands_served(client: redis.Redis) -> Counter[str]:
    """Commands the server has run, by name (INFO commandstats), the bench's INFO excluded."""
    stats: dict[str, dict[str, Any]] = client.info("commandstats")
    return Counter(
        {
            k.removeprefix("cmdstat_"): int(v["calls"])
            for k, v in stats.items()
            if k != "cmdstat_info"
        }
    )


def store_now_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


def wait_ready(groups: ProcessGroups, recorder: redis.Redis, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while recorder.llen(READY_KEY) < count:
        groups.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{recorder.llen(READY_KEY)}/{count} bench workers ready after {timeout_s:g}s "
                f"(logs in {groups.log_dir})"
            )
        time.sleep(0.05)


def wait_started(recorder: redis.Redis, tasks: int, deadline: float) -> None:
    """Until ``tasks`` distinct task ids have started, or the deadline."""
    seen: set[str] = set()
    read = 0
    while len(seen) < tasks and time.monotonic() < deadline:
        new = recorder.lrange(STARTS_KEY, read, -1)
        read += len(new)
        seen.update(json.loads(r)["id"] for r in new)
        if len(seen) < tasks:
            time.sleep(0.02)


@dataclass(frozen=True)
class Measured:
    """One run: the figures from body starts (and ledger), and what it cost."""

    system: str
    figures: RunFigures
    records: list[dict[str, Any]]
    retries: int
    worker_cpu_s: float
    #: Of which the process each command started (Celery's worker main, Dramatiq's master).
    main_cpu_s: float
    redis_cpu_s: float
    commands: Counter[str]
    #: celery_interval only: ledger entries by op (grant:OK, claim:OK, claim:RETICKET, ...).
    ledger_ops: Counter[str]
    run_s: float

    def row(self) -> dict[str, Any]:
        """One JSON-ready result row (NaN becomes null)."""
        f = self.figures
        started = max(1, f.completed)
        row = {
            "system": self.system,
            "interval_s": f.interval_s,
            "workers": f.workers,
            "tasks": f.tasks,
            "completed": f.completed,
            "duplicates": f.duplicates,
            "missing": f.tasks - f.completed,
            "utilization": f.body_utilization,
            "min_gap_s": f.body_min_gap_s,
            "violations": f.body_gaps_below_90pct,
            "p50_gap_s": f.body_gap_p50_s,
            "p99_gap_s": f.body_gap_p99_s,
            "p99_lateness_s": f.p99_lateness_s if f.claims else None,
            # celery_interval only: the claims in its ledger, spaced on the store's clock
            "claim_violations": f.violations if f.claims else None,
            "claim_min_gap_s": f.min_gap_s if f.claims else None,
            "claim_utilization": f.utilization if f.claims else None,
            # body gaps below interval - max(10 %, 3 ms): what OS wake-ups may take off
            "body_below_floor": f.body_below_floor,
            "retries": self.retries,
            "retickets": self.ledger_ops["claim:RETICKET"] if f.claims else None,
            # per started task; commandstats counts every command a Lua script runs, and the
            # script call itself
            "redis_commands_per_task": self.commands.total() / started,
            "redis_script_calls_per_task": sum(self.commands[c] for c in SCRIPT_COMMANDS) / started,
            "worker_cpu_s_per_task": self.worker_cpu_s / started,
            "main_cpu_s_per_task": self.main_cpu_s / started,
            "redis_cpu_s_per_task": self.redis_cpu_s / started,
            "run_s": self.run_s,
        }
        return {
            k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()
        }

    def start_times_s(self) -> list[float]:
        """Body starts in seconds on CLOCK_MONOTONIC, sorted."""
        return start_times_s(self.records)


def run_system(
    system: System,
    servers: Servers,
    *,
    interval_s: float,
    tasks: int,
    workers: int,
    timeout_s: float,
) -> Measured:
    """Start the system's workers, enqueue ``tasks`` up front, measure until all have started."""
    client = servers.measured_client()
    recorder = servers.recorder
    redis_proc = psutil.Process(servers.measured.proc.pid) if servers.measured.proc else None
    groups = ProcessGroups()
    try:
        groups.start(system.commands, system.env)
        wait_ready(groups, recorder, system.ready_count, timeout_s=90)
        time.sleep(0.5)  # let every consumer settle into its fetch loop
        before = costs_now(groups, redis_proc, client)
        since_us = store_now_us(client)
        began = time.monotonic()
        system.enqueue(servers, tasks)
        wait_started(recorder, tasks, deadline=began + timeout_s)
        run_s = time.monotonic() - began
        used = costs_now(groups, redis_proc, client) - before
        time.sleep(max(0.5, 10 * interval_s))  # late duplicates still show up
        raw = recorder.lrange(STARTS_KEY, 0, -1)
        ledger: Any = client.xrange(ledger_key(KEY_PREFIX, QUEUE)) if system.has_ledger else []
    finally:
        groups.stop()
    groups.remove_logs()
    records = [json.loads(r) for r in raw]
    figures = figures_from(
        raw, ledger, tasks=tasks, interval_s=interval_s, workers=workers, since_us=since_us
    )
    return Measured(
        system=system.name,
        figures=figures,
        records=records,
        retries=sum(int(r.get("retries") or 0) for r in records),
        worker_cpu_s=used.worker_s,
        main_cpu_s=used.main_s,
        redis_cpu_s=used.redis_s,
        commands=used.commands,
        ledger_ops=Counter(_op(fields) for _id, fields in ledger),
        run_s=run_s,
    )


def _op(fields: dict[bytes, bytes]) -> str:
    return fields.get(b"op", b"").decode()


def note(message: str) -> None:
    """Progress and skips go to stderr, so ``--json`` keeps stdout to one object."""
    print(message, file=sys.stderr, flush=True)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    """A Markdown table; ``align`` has one letter per column: l(eft) or r(ight)."""
    rule = ["---:" if a == "r" else "---" for a in align]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in [header, rule, *rows])


def ms(seconds: float | None, digits: int = 2) -> str:
    """Seconds as milliseconds for a table cell ("-" when undefined)."""
    return "-" if seconds is None else f"{seconds * 1e3:.{digits}f}"


def machine_line() -> str:
    """Where and when: CPUs, load, date (for the header of every bench's output)."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}, {os.cpu_count()} CPUs, load average {load}, "
        f"Python {sys.version.split()[0]}"
    )


def publish_copy(producer: Any, message: Any, queue: str, args: list[Any]) -> None:
    """Publish to ``queue`` a copy of the Celery task ``message`` (a template taken from a
    broker) with positional ``args`` and a new task id: a bulk send without Celery's per-call
    cost."""
    _args, kwargs, embed = json.loads(message.body)
    task_id = str(uuid.uuid4())
    headers = {
        **message.headers,
        "id": task_id,
        "root_id": task_id,
        "argsrepr": repr(tuple(args)),
        "interval_send": os.urandom(4).hex(),
    }
    producer.publish(
        json.dumps([args, kwargs, embed]).encode(),
        routing_key=queue,
        headers=headers,
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        correlation_id=task_id,
        delivery_mode=2,
        retry=False,
    )
