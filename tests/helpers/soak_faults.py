"""The soak's fault schedule (drawn from a seed) and the private servers the faults hit."""

from __future__ import annotations

import glob
import os
import random
import shutil
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from celery_interval.demo.embedded import RedisProc
from tests.helpers.latency import LatencyProxy

#: Every fault kind the soak injects, and the controls it mixes in.
FAULTS = (
    "worker_kill",
    "store_restart",
    "store_loss",
    "store_hang",
    "broker_restart",
    "cut",
    "slow_link",
)
CONTROLS = ("pause", "set_interval", "revoke")
#: How long each kind lasts (s): the worker's time dead, the store's or broker's down time.
DURATIONS_S: dict[str, tuple[float, float]] = {
    "worker_kill": (0.5, 3.0),
    "store_restart": (0.2, 2.0),
    "store_loss": (0.2, 2.0),
    "store_hang": (1.0, 4.0),
    "broker_restart": (0.5, 3.0),
    "cut": (0.0, 0.0),
    "slow_link": (3.0, 8.0),
    "pause": (0.5, 3.0),
    "set_interval": (2.0, 6.0),
    "revoke": (0.0, 0.0),
}


@dataclass(frozen=True)
class Event:
    """One fault or control: its kind, when it begins (s into the run), how long it lasts,
    and a number it uses (which worker to kill)."""

    at_s: float
    kind: str
    dur_s: float
    arg: int = 0

    def line(self) -> str:
        return f"{self.at_s:7.2f}s {self.kind:<14} {self.dur_s:5.2f}s arg={self.arg}"


def schedule(seed: int, seconds: float, kinds: tuple[str, ...] = FAULTS) -> list[Event]:
    """Faults one after another (never two at once), controls beside them, from ``seed``."""
    rng = random.Random(seed)
    events = []
    at_s = rng.uniform(2.0, 4.0)
    while kinds and at_s < seconds - 4.0:
        kind = rng.choice(kinds)
        low, high = DURATIONS_S[kind]
        dur_s = round(rng.uniform(low, high), 2)
        events.append(Event(round(at_s, 2), kind, dur_s, rng.randrange(3)))
        at_s += dur_s + rng.uniform(1.0, 4.0)
    for kind in CONTROLS:
        at_s = rng.uniform(1.0, 5.0)
        while at_s < seconds - 3.0:
            low, high = DURATIONS_S[kind]
            dur_s = round(rng.uniform(low, high), 2)
            events.append(Event(round(at_s, 2), kind, dur_s, rng.randrange(3)))
            at_s += dur_s + rng.uniform(2.0, 6.0)
    return sorted(events, key=lambda e: e.at_s)


def schedule_text(events: list[Event]) -> str:
    return "\n".join(e.line() for e in events)


def schedule_json(events: list[Event]) -> list[dict[str, Any]]:
    return [asdict(e) for e in events]


class StoreProc(RedisProc):
    """The store: durable (AOF synced on every write), so a restart keeps every key unless
    ``restart_empty`` removes its files first (the state lost)."""

    def __init__(self) -> None:
        super().__init__(durable=True)

    def restart_empty(self) -> None:
        self.kill()
        shutil.rmtree(os.path.join(self.dir, "appendonlydir"), ignore_errors=True)
        for path in glob.glob(os.path.join(self.dir, "*.aof")):
            os.remove(path)
        self._start(fixed_port=True)

    def hang(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)


def cut_clients(url: str) -> None:
    """Close every client connection of a Redis (its own server stays up)."""
    conn = redis.Redis.from_url(url, socket_timeout=2)
    try:
        conn.client_kill_filter(_type="normal", skipme=True)
    finally:
        conn.close()


class Broker:
    """The soak's private broker, a durable Redis or a RabbitMQ node, that faults may restart."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.redis: RedisProc | None = None
        self.rabbit: Any = None
        if kind == "redis":
            self.redis = RedisProc(durable=True)
            self.url = self.redis.broker_url_for(1)
        else:
            from tests.helpers.brokerproc import RabbitNode

            self.rabbit = RabbitNode(tmp)
            self.url = self.rabbit.url

    @property
    def is_down(self) -> bool:
        return not (self.redis.alive if self.redis is not None else self.rabbit.alive)

    def down(self) -> None:
        if self.redis is not None:
            self.redis.kill()
        else:
            self.rabbit.kill()

    def up(self) -> None:
        if self.redis is not None:
            if not self.redis.alive:
                self.redis.restart()
        elif not self.rabbit.alive:
            self.rabbit.start()

    def cut(self) -> None:
        if self.redis is not None:
            cut_clients(self.redis.url_for(1))
        else:
            self.rabbit.close_connections()

    def stop(self) -> None:
        if self.redis is not None:
            self.redis.stop()
        else:
            self.rabbit.stop()


class SlowLink:
    """A proxy to the store whose delay each way the schedule turns up and down."""

    def __init__(self, store_port: int) -> None:
        self.proxy = LatencyProxy("127.0.0.1", store_port, 0.0).__enter__()
        self.url = f"redis://127.0.0.1:{self.proxy.port}/0"

    def slow(self, delay_s: float = 0.015) -> None:
        self.proxy.delay_s = delay_s

    def fast(self) -> None:
        self.proxy.delay_s = 0.0

    def stop(self) -> None:
        self.proxy.__exit__(None, None, None)


def wait_until(check: Any, timeout_s: float, step_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(step_s)
    return bool(check())
