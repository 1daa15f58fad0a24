"""``celery-interval demo``: a real pool of workers on an embedded Redis, paused mid-run."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import redis

from celery_interval.config.table import KEY_PREFIX
from celery_interval.demo.embedded import RedisProc
from celery_interval.demo.report import RunFigures, figures_from
from celery_interval.stores.base import Store
from celery_interval.stores.functions import SCRIPT_COMMANDS
from celery_interval.stores.keys import ledger_key, state_key

__all__ = ["DemoOptions", "run_demo"]


@dataclass(frozen=True)
class DemoOptions:
    """What ``celery-interval demo`` was asked to do."""

    workers: int = 3
    tasks: int = 60
    interval_s: float = 0.05
    pause_s: float = 2.0
    broker: str | None = None
    store: str | None = None
    as_json: bool = False
    timeout_s: float = 120.0
    #: More ``celery worker`` options for every worker (``--max-tasks-per-child=1``).
    worker_args: tuple[str, ...] = ()


@contextlib.contextmanager
def _servers(options: DemoOptions) -> Iterator[tuple[str, str]]:
    """The broker and store URLs: given ones, else an embedded redis-server on a unix socket."""
    if options.broker and options.store:
        yield options.broker, options.store
        return
    with RedisProc(unix_socket=True) as server:
        yield options.broker or server.broker_url_for(1), options.store or server.url_for(0)


def _env(broker: str, store: str, interval_s: float) -> dict[str, str]:
    return {
        **os.environ,
        "CELERY_INTERVAL_DEMO_BROKER": broker,
        "CELERY_INTERVAL_DEMO_STORE": store,
        "CELERY_INTERVAL_DEMO_INTERVAL": repr(interval_s),
    }


def _celery(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "celery_interval.demo.app", *args]


def run_demo(options: DemoOptions, out: Any = None) -> tuple[int, RunFigures]:
    """Run the demo; returns (exit code, figures). Exit 0 only for exactly-once and no violation."""
    from celery_interval.demo import app as demo_app

    out = out or sys.stdout
    with _servers(options) as (broker, store):
        env = _env(broker, store, options.interval_s)
        os.environ.update(env)
        app = demo_app.make_app(broker, store, demo_app.QUEUE, options.interval_s)
        conn = redis.Redis.from_url(store)
        _clear_demo_keys(conn)
        procs = _start_workers(options, env)
        try:
            _wait_ready(app, options.workers, procs)
            started_us = _store_now_us(conn)
            calls_before = _script_calls(conn)
            _send_tasks(app, options.tasks)
            _drive(options, env, conn, _LiveView(options, conn, out, store))
            figures = _figures(options, conn, started_us, calls_before)
        finally:
            _stop_workers(procs)
    ok = figures.completed == options.tasks and figures.duplicates == 0 and figures.violations == 0
    if options.as_json:
        print(json.dumps(figures.as_dict()), file=out)
    else:
        _final_table(figures, ok, out)
    return (0 if ok else 1), figures


def _clear_demo_keys(conn: redis.Redis) -> None:
    """Delete what an earlier demo left in the store: its records, ledger and bucket state."""
    from celery_interval.demo import app as demo_app

    for key in (demo_app.RECORD_KEY, ledger_key(KEY_PREFIX, demo_app.QUEUE)):
        conn.delete(key)
    conn.delete(state_key(KEY_PREFIX, demo_app.QUEUE))


def _start_workers(options: DemoOptions, env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    """Start ``options.workers`` real ``celery worker`` processes on the demo queue."""
    from celery_interval.demo import app as demo_app

    return [
        subprocess.Popen(
            _celery(
                "worker",
                "-Q",
                demo_app.QUEUE,
                "-c",
                "2",
                "-n",
                f"host{n + 1}@demo",
                "-l",
                "WARNING",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                *options.worker_args,
            ),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for n in range(options.workers)
    ]


def _stop_workers(procs: list[subprocess.Popen[bytes]], grace_s: float = 15) -> None:
    """Terminate the workers, then kill any still running ``grace_s`` after."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()


def _send_tasks(app: Any, tasks: int) -> None:
    """Send ``tasks`` demo tasks (0, 1, …) through one producer."""
    from celery_interval.demo import app as demo_app

    with app.producer_or_acquire() as producer:
        for i in range(tasks):
            app.send_task(demo_app.call_api.name, args=(i,), producer=producer)


def _figures(
    options: DemoOptions, conn: redis.Redis, started_us: int, calls_before: int
) -> RunFigures:
    """The run's figures from the records and ledger the store holds since ``started_us``."""
    from celery_interval.demo import app as demo_app

    return figures_from(
        conn.lrange(demo_app.RECORD_KEY, 0, -1),
        cast(Any, conn.xrange(ledger_key(KEY_PREFIX, demo_app.QUEUE))),
        tasks=options.tasks,
        interval_s=options.interval_s,
        workers=options.workers,
        since_us=started_us,
        store_calls=_script_calls(conn) - calls_before,
    )


def _wait_ready(app: Any, workers: int, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a demo worker exited during start-up")
        if len(app.control.ping(timeout=0.5) or []) >= workers:
            return
    raise RuntimeError(f"demo workers not ready within 60s ({workers} expected)")


def _script_calls(conn: redis.Redis) -> int:
    """Lua script calls the store has served (grant, claim, done, control), from INFO."""
    stats = conn.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in SCRIPT_COMMANDS)


def _store_now_us(conn: redis.Redis) -> int:
    seconds, micros = conn.time()
    return int(seconds) * 1_000_000 + int(micros)


def _drive(options: DemoOptions, env: dict[str, str], conn: redis.Redis, view: _LiveView) -> None:
    """Pause after a third of the tasks started, unpause ``pause_s`` later, wait for the rest."""
    from celery_interval.demo import app as demo_app

    deadline = time.monotonic() + options.timeout_s
    phase = "running"
    resume_at = 0.0
    with view:
        while time.monotonic() < deadline:
            started = conn.llen(demo_app.RECORD_KEY)
            if phase == "running" and started >= options.tasks // 3 and options.pause_s > 0:
                _control(env, "pause_queue")
                phase, resume_at = "paused", time.monotonic() + options.pause_s
            elif phase == "paused" and time.monotonic() >= resume_at:
                _control(env, "unpause_queue")
                phase = "resumed"
            view.update(phase)
            if started >= options.tasks and phase != "paused":
                time.sleep(min(1.0, 10 * options.interval_s))
                view.update("done")
                return
            time.sleep(0.1)


def _control(env: dict[str, str], command: str) -> None:
    """The real remote control command line, as an operator would type it."""
    from celery_interval.demo import app as demo_app

    subprocess.run(
        _celery("control", command, demo_app.QUEUE, "--timeout", "1"),
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class _LiveView:
    """A rich live table of starts per worker, achieved rate and pause state (off for --json)."""

    def __init__(self, options: DemoOptions, conn: redis.Redis, out: Any, store_url: str) -> None:
        self.options = options
        self.conn = conn
        self.store_url = store_url
        self.store: Store | None = None
        self.live: Any = None
        if not options.as_json:
            from rich.console import Console
            from rich.live import Live

            self.live = Live(console=Console(file=out), refresh_per_second=8, transient=False)

    def __enter__(self) -> _LiveView:
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def next_slot_s(self) -> float:
        """Seconds from now to the next free slot of the demo queue, from the store."""
        from celery_interval.demo import app as demo_app
        from celery_interval.stores import store_from_url

        if self.store is None:
            self.store = store_from_url(self.store_url)
        return (
            self.store.status(demo_app.QUEUE, round(self.options.interval_s * 1e6)).next_slot_in_us
            / 1e6
        )

    def update(self, phase: str) -> None:
        if self.live is None:
            return
        from rich.table import Table

        from celery_interval.demo import app as demo_app

        records = [json.loads(r) for r in self.conn.lrange(demo_app.RECORD_KEY, 0, -1)]
        per_worker = Counter(r["worker"] for r in records)
        recent = [r["us"] for r in records if r["us"] >= max(r["us"] for r in records) - 1e6]
        rate = (len(recent) - 1) / ((recent[-1] - recent[0]) / 1e6) if len(recent) > 2 else 0.0
        table = Table(title=f"celery-interval demo: {demo_app.QUEUE!r} {phase}", show_header=False)
        table.add_column("")
        table.add_column("", justify="right")
        for worker, count in sorted(per_worker.items()):
            table.add_row(f"started on {worker}", str(count))
        table.add_row("started, all workers", f"{len(records)}/{self.options.tasks}")
        table.add_row("achieved rate (last 1 s)", f"{rate:.1f}/s")
        table.add_row("target rate", f"{1 / self.options.interval_s:.1f}/s")
        table.add_row("next slot in", f"{self.next_slot_s():.3f}s")
        self.live.update(table)


def _final_table(figures: RunFigures, ok: bool, out: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="result: " + ("PASS" if ok else "FAIL"))
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in figures.as_dict().items():
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    Console(file=out).print(table)
