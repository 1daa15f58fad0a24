"""One soak run: 3 real workers with every feature on, a seed's faults, then the checker."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

import celery_interval
from celery_interval.demo.embedded import RedisProc
from celery_interval.testing.processes import WorkerProcess
from tests.helpers.limiting import limiting_server
from tests.helpers.popped import held_at_the_end
from tests.helpers.soak_check import Events, Verdict, check
from tests.helpers.soak_config import API_RATE, MAIN_SLOW_S, Layout
from tests.helpers.soak_faults import FAULTS, Broker, Event, SlowLink, StoreProc, cut_clients
from tests.helpers.soak_faults import schedule as make_schedule
from tests.helpers.soak_ledger import (
    Ledger,
    died_as_they_began,
    in_ledger,
    read_ledgers,
    resent_unseen,
    throttles,
)
from tests.helpers.soak_plan import TENANT_KEYS, batch
from tests.helpers.soakapp import RECORD_KEY, make_app

ROOT_DIR = Path(__file__).resolve().parents[2]
WORKERS = 3
TICK_S = 0.25


@dataclass
class Result:
    seed: int
    broker: str
    schedule: list[Event]
    verdict: Verdict
    jobs: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    findings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        v = self.verdict
        faults = ", ".join(f"{k}={n}" for k, n in sorted(self.faults.items()))
        return (
            f"seed {self.seed} [{self.broker}]: jobs={self.jobs} steps={v.steps} ran={v.ran} "
            f"revoked={v.revoked} excused={v.excused} popped={len(v.popped)} "
            f"faults: {faults or 'none'} | "
            f"violations={len(v.violations)} lost={len(v.lost)} doubled={len(v.doubled)} "
            f"forgotten={len(v.forgotten)} worker_exits={len(self.findings)}"
        )

    @property
    def ok(self) -> bool:
        return self.verdict.ok and not self.findings


class Soak:
    """The servers, the workers and the run's events; ``run()`` returns the checked result."""

    def __init__(
        self, broker: str, seed: int, seconds: float, kinds: tuple[str, ...] = FAULTS
    ) -> None:
        self.broker_kind = broker
        self.seed = seed
        self.seconds = seconds
        self.rng = random.Random(seed * 7919 + 1)
        self.schedule = make_schedule(seed, seconds, kinds)
        self.layout = Layout(f"s{uuid.uuid4().hex[:6]}")
        self.tmp = Path(tempfile.mkdtemp(prefix="ci-soak-"))
        self.events = Events()
        self.faults: Counter[str] = Counter()
        self.findings: list[str] = []
        self.workers: list[WorkerProcess | None] = [None] * WORKERS
        self.spawned = 0
        self.killed: set[str] = set()
        self.kill_windows_us: list[tuple[str, int, int]] = []
        self.sent_ids = self.events.ids
        self._in_force: dict[Event, int] = {}
        self.undos: list[Event] = []
        #: When each undo was first tried (it may have been written though its call raised).
        self._undo_from: dict[Event, int] = {}
        self.ledger: Ledger = {}
        self.wall_offset_ns = time.time_ns() - time.monotonic_ns()

    # -- processes -------------------------------------------------------------------------

    def _spawn(self, slot: int) -> None:
        self.spawned += 1
        name = f"w{self.spawned}-{self.layout.prefix}@localhost"
        store = self.link.url if slot == 0 else self.store.url
        env = dict(os.environ)
        env.update(
            CI_SOAK_PREFIX=self.layout.prefix,
            CI_SOAK_BROKER=self.broker.url,
            CI_SOAK_STORE=store,
            CI_SOAK_RECORD=self.recorder_proc.url,
            CI_SOAK_API=self.api.url + "/call",
            PYTHONPATH=os.pathsep.join([str(ROOT_DIR), env.get("PYTHONPATH", "")]),
        )
        log_path = self.tmp / f"{name}.log"
        cmd = [
            sys.executable, "-m", "celery", "-A", "tests.helpers.soakapp", "worker",
            "-Q", ",".join(self.layout.queues), "-c", "2", "-P", "prefork", "-n", name,
            "-l", "INFO", "--without-gossip", "--without-mingle",
        ]  # fmt: skip
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                cmd, cwd=ROOT_DIR, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self.workers[slot] = WorkerProcess(name, proc, log_path)

    def _wait_ready(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        pending = {w.name for w in self.workers if w is not None}
        while pending and time.monotonic() < deadline:
            try:
                replies = self.app.control.ping(destination=list(pending), timeout=0.5) or []
            except Exception:
                time.sleep(0.3)
                continue
            for reply in replies:
                pending -= set(reply)
        if pending:
            raise RuntimeError(f"soak workers not ready after {timeout_s}s: {pending}")

    def _kill(self, slot: int) -> None:
        worker = self.workers[slot]
        if worker is None or worker.proc.poll() is not None:
            return
        first_us = time.time_ns() // 1000
        children = subprocess.run(
            ["pgrep", "-P", str(worker.proc.pid)], capture_output=True, text=True
        ).stdout.split()
        worker.proc.send_signal(signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        worker.proc.wait(timeout=30)
        self.events.kills.append((worker.name, time.monotonic_ns()))  # its pool is gone too
        self.killed.add(worker.name)
        self.kill_windows_us.append((worker.name, first_us, time.time_ns() // 1000))
        self.workers[slot] = None

    def _watch_workers(self) -> None:
        """A worker that exited by itself is a finding; a new one takes its place."""
        for slot, worker in enumerate(self.workers):
            if worker is not None and worker.proc.poll() is not None:
                tail = worker.log()[-1500:]
                self.findings.append(
                    f"{worker.name} exited by itself (code {worker.proc.returncode}):\n{tail}"
                )
                self.events.kills.append((worker.name, time.monotonic_ns()))
                self.workers[slot] = None
                self._spawn(slot)

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> Result:
        self.recorder_proc = RedisProc()
        self.store = StoreProc()
        self.broker = Broker(self.broker_kind, self.tmp)
        self.link = SlowLink(self.store.port)
        self.api = limiting_server().LimitingServer(rate=API_RATE, burst=1).start()
        self.recorder = redis.Redis.from_url(self.recorder_proc.url)
        self.app = make_app(self.broker.url, self.store.url, self.layout.prefix)
        # the runner's own sends give up quickly (Celery's default): its loop ends the faults
        self.app.conf.task_publish_retry_policy = {"max_retries": 3, "interval_step": 0.2}
        try:
            for slot in range(WORKERS):
                self._spawn(slot)
            self._wait_ready()
            self._drive()
            self._settle()
            result = self._result()
        finally:
            self._teardown()
        if result.ok:  # a failing run keeps its record, ledger and logs for a look
            shutil.rmtree(self.tmp, ignore_errors=True)
        return result

    def _drive(self) -> None:
        began = time.monotonic()
        pending = sorted(
            [(e.at_s, 0, e) for e in self.schedule]
            + [(e.at_s + e.dur_s, 1, e) for e in self.schedule],
            key=lambda x: (x[0], x[1]),
        )
        tick = 0
        # Every fault of the schedule begins, even where a slow one (a RabbitMQ node booting)
        # pushed the later ones past the run's length.
        while time.monotonic() - began < self.seconds or any(not e for _, e, _ in pending):
            now_s = time.monotonic() - began
            while pending and pending[0][0] <= now_s:
                _, end, event = pending.pop(0)
                (self._end if end else self._begin)(event)
            self._send(tick)
            self._retry_undos()
            self._watch_workers()
            tick += 1
            time.sleep(max(0.0, began + tick * TICK_S - time.monotonic()))
        for _, end, event in pending:
            if end:
                self._end(event)

    def _begin(self, event: Event) -> None:
        kind = event.kind
        if kind in FAULTS:
            self.faults[kind] += 1
        if kind == "worker_kill":
            self._kill(event.arg)
        elif kind == "store_restart":
            self.store.kill()
        elif kind == "store_loss":
            self._read_ledgers()
            self.events.losses.append(time.monotonic_ns())
            self.store.kill()
        elif kind == "store_hang":
            self.store.hang()
        elif kind == "broker_restart":
            self.broker.down()
        elif kind == "cut":
            with contextlib.suppress(Exception):
                cut_clients(self.store.url)
            with contextlib.suppress(Exception):
                self.broker.cut()
        elif kind == "slow_link":
            self.link.slow()
        elif kind == "pause":
            self._control(event, celery_interval.pause, self.layout.main)
        elif kind == "set_interval":
            self._control(event, celery_interval.set_interval, self.layout.main, MAIN_SLOW_S)
        elif kind == "revoke" and not self.broker.is_down:  # a broadcast waits for the broker
            self._revoke()

    def _end(self, event: Event) -> None:
        kind = event.kind
        if kind == "worker_kill":
            self._spawn(event.arg) if self.workers[event.arg] is None else None
        elif kind == "store_restart":
            self.store.restart()
        elif kind == "store_loss":
            self.store.restart_empty()
            self.events.returns.append(time.monotonic_ns())
        elif kind == "store_hang":
            self.store.resume()
        elif kind == "broker_restart":
            self.broker.up()
        elif kind == "slow_link":
            self.link.fast()
        elif kind in ("pause", "set_interval"):
            self._undo(event)

    def _control(self, event: Event, call: Any, *args: Any) -> None:
        try:
            # the workers read the store's state anyway; a broadcast needs the broker
            call(self.app, *args, broadcast=not self.broker.is_down)
        except Exception as exc:  # the store down or hung: the control may not be in force
            self.note(f"{event.kind} at {event.at_s}s failed: {exc!r}")
            self._in_force[event] = -1
            return
        self._in_force[event] = time.monotonic_ns()

    def note(self, line: str) -> None:
        print(f"  note: {line}", flush=True)

    def _undo(self, event: Event) -> None:
        """Unpause or unset now, or on a later tick if the store does not answer; not at all
        once a newer control of the same kind is in force (its own undo ends it: a late undo
        would end the newer one, which the check still counts in force)."""
        undo = celery_interval.unpause if event.kind == "pause" else celery_interval.unset_interval
        # A call that raised may have been written (its reply lost with a fault): the window
        # ends at the first try, so the check never counts a start after a real undo.
        to_ns = self._undo_from.setdefault(event, time.monotonic_ns())
        newer = any(e.kind == event.kind and e.at_s > event.at_s for e in self._in_force)
        if not newer:
            try:
                undo(self.app, self.layout.main, broadcast=not self.broker.is_down)
            except Exception:
                self.undos.append(event)
                return
        self.undos = [e for e in self.undos if e is not event]
        self._undo_from.pop(event, None)
        from_ns = self._in_force.pop(event, -1)
        if from_ns < 0:
            return
        if event.kind == "pause":
            self.events.pauses.append((self.layout.main, from_ns, to_ns))
        else:
            slow_us = round(MAIN_SLOW_S * 1e6)
            self.events.overrides.append((self.layout.main, from_ns, to_ns, slow_us))

    def _retry_undos(self) -> None:
        for event in list(self.undos):
            self.undos.remove(event)
            self._undo(event)

    def _revoke(self) -> None:
        started = {json.loads(r)["job"] for r in self.recorder.lrange(RECORD_KEY, -400, -1)}
        candidates = [
            job
            for job in list(self.sent_ids)[-60:]
            if job.startswith("m") and job not in started and job in self.events.expected
        ]
        for job in self.rng.sample(candidates, min(2, len(candidates))):
            with contextlib.suppress(Exception):
                self.app.control.revoke(self.sent_ids[job])
                # a replacement keeps its task's id: the revoke reaches it too
                self.events.revoked.update((job, f"{job}/r"))

    def _send(self, tick: int) -> None:
        sends, follow = batch(tick, self.rng, self.layout)
        if self.broker.is_down:
            return
        self.events.expected.update(follow)
        for send in sends:
            self.events.expected[send.job] = send.steps
            try:
                result = self.app.send_task(
                    send.task, args=send.args, kwargs=send.kwargs, queue=send.queue
                )
                self.sent_ids[send.job] = result.id
            except Exception:
                self.events.uncertain.add(send.job)

    # -- the end ---------------------------------------------------------------------------

    def _settle(self, idle_s: float = 30.0, timeout_s: float = 300.0) -> None:
        """Everything back up, then wait until every job ran, or nothing started for
        ``idle_s`` (what has not run by then is stuck), or ``timeout_s``."""
        self.store.resume()
        if not self.store.alive:
            self.store.restart()
        self.broker.up()
        self.link.fast()
        for slot, worker in enumerate(self.workers):
            if worker is None:
                self._spawn(slot)
        deadline = time.monotonic() + timeout_s
        while self.undos and time.monotonic() < deadline:
            self._retry_undos()
            time.sleep(0.3)
        if self.undos:
            self.findings.append(f"never undone: {self.undos}")
        seen, idle_since = -1, time.monotonic()
        while time.monotonic() < deadline:
            self._watch_workers()
            # Idle is judged on a fresh count: on a loaded machine one check may take longer
            # than idle_s while records keep coming.
            count, now = int(self.recorder.llen(RECORD_KEY)), time.monotonic()
            if count != seen:
                seen, idle_since = count, now
            elif now - idle_since >= idle_s:
                return
            if not self._check().lost:
                time.sleep(3.0)  # strays: a doubled start comes after the first
                return
            time.sleep(2.0)

    def _records(self) -> list[dict[str, Any]]:
        return [json.loads(r) for r in self.recorder.lrange(RECORD_KEY, 0, -1)]

    def _check(self) -> Verdict:
        return check(self._records(), self.events, self.layout.rule)

    def _buckets(self) -> list[tuple[str, str | None]]:
        """Each bucket with its outer bucket (None: not nested)."""
        tenants = [(f"{self.layout.tenants}:{key}", self.layout.tenants) for key in TENANT_KEYS]
        return [*((queue, None) for queue in self.layout.queues), *tenants]

    def _read_ledgers(self) -> None:
        try:
            read_ledgers(self.store.url, self._buckets(), self.ledger)
        except redis.RedisError as exc:
            self.note(f"ledger not read: {exc!r}")

    def _from_ledger(self) -> None:
        self._read_ledgers()
        self.events.throttles = throttles(self.ledger, self.wall_offset_ns)
        self.events.wall_offset_ns = self.wall_offset_ns
        self.events.excused_ids = died_as_they_began(self.ledger, self.kill_windows_us)
        self.events.in_ledger = in_ledger(self.ledger)
        self.events.resent_unseen = resent_unseen(self.ledger)
        # a message back in the broker after a lost connection may be popped as a worker dies
        self.events.received = held_at_the_end(
            {path.stem: path.read_text(errors="replace") for path in self.tmp.glob("w*.log")},
            {name for name, _at in self.events.kills},
        )
        if self.broker_kind == "redis":
            self.events.pops = len(self.events.kills) + WORKERS * self.faults["broker_restart"]

    def _result(self) -> Result:
        self._from_ledger()
        records = self._records()
        verdict = check(records, self.events, self.layout.rule)
        dump = {
            "prefix": self.layout.prefix,
            "records": records,
            "ledger": [{"bucket": b, "id": i.decode(), **e} for (b, i), e in self.ledger.items()],
            "events": {
                k: sorted(v) if isinstance(v, set) else v for k, v in vars(self.events).items()
            },
            "kill_windows_us": self.kill_windows_us,
            "wall_offset_ns": self.wall_offset_ns,
        }
        (self.tmp / "soak.json").write_text(json.dumps(dump))
        if not verdict.ok or self.findings:
            print(f"  the record, ledger and worker logs: {self.tmp}", flush=True)
        return Result(
            self.seed,
            self.broker_kind,
            self.schedule,
            verdict,
            jobs=len(self.events.expected),
            faults=self.faults,
            findings=self.findings,
        )

    def _teardown(self) -> None:
        for worker in self.workers:
            if worker is not None and worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)
        for slot, worker in enumerate(self.workers):
            if worker is None:
                continue
            try:
                worker.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._kill(slot)
        for stop in (self.api.stop, self.link.stop, self.broker.stop, self.store.stop):
            with contextlib.suppress(Exception):
                stop()
        self.recorder_proc.stop()
