"""A Celery app whose every task exists twice: ``compat.i.*`` on IntervalTask, ``compat.p.*`` plain.

Both kinds are routed by ``task_routes`` (``compat.i.*`` to the interval queue, ``compat.p.*`` to
a plain queue) and record each body start on the store's Redis, so a test can run one Celery
semantic on both kinds side by side and compare what happened.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery, Task, shared_task
from celery.exceptions import Reject, SoftTimeLimitExceeded
from kombu import Exchange, Queue

from celery_interval import IntervalTask

KINDS = ("i", "p")


def make_app(broker: str, store: str, queue: str, interval_s: float, **conf: Any) -> Celery:
    """The app a user would write: one interval queue, one plain queue, routes by task name.
    ``conf["interval_queues"]`` adds declarations; the queue's own is merged over its
    ``interval_s`` (``{queue: {"burst": 3}}`` keeps the interval)."""
    _where.update(store=store, queue=queue)
    app = Celery("compat", broker=broker, backend=store, set_as_current=False)
    interval_queues: dict[str, Any] = {queue: interval_s}
    for name, declared in conf.pop("interval_queues", {}).items():
        merged = name == queue and isinstance(declared, dict)
        interval_queues[name] = {"interval": interval_s, **declared} if merged else declared
    if conf.pop("compat_routing", False):
        interval_queues.update(routing_queues(queue, interval_s))
        conf["task_queues"] = declared_queues(queue)
    else:  # both queues take priorities (RabbitMQ: x-max-priority; Redis: kombu's steps)
        conf["task_queues"] = [
            Queue(name, Exchange(name), routing_key=name, queue_arguments={"x-max-priority": 10})
            for name in (queue, f"{queue}-plain")
        ]
        conf.setdefault("worker_prefetch_multiplier", 1)
    app.conf.update(
        interval_store_url=store,
        interval_queues=interval_queues,
        task_default_queue=f"{queue}-plain",
        task_routes={"compat.i.*": {"queue": queue}, "compat.p.*": {"queue": f"{queue}-plain"}},
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        result_expires=600,
        **conf,
    )
    return app


def routing_queues(queue: str, interval_s: float) -> dict[str, float]:
    """The extra interval queues of the routing tests, each with an interval of its own."""
    return {
        f"{queue}-slow": 4 * interval_s,
        f"{queue}-events": 2 * interval_s,
        f"{queue}-fan1": 3 * interval_s,
        f"{queue}-fan2": 5 * interval_s,
    }


def exchanges(queue: str) -> tuple[Exchange, Exchange]:
    """The topic and the fanout exchange of the routing tests."""
    return Exchange(f"{queue}-topic", type="topic"), Exchange(f"{queue}-fanout", type="fanout")


def declared_queues(queue: str) -> list[Queue]:
    """Every queue of the routing tests: direct ones, one bound to a topic exchange by a
    pattern that is no queue name, two bound to one fanout exchange."""
    topic, fanout = exchanges(queue)
    return [
        Queue(queue, Exchange(queue), routing_key=queue),
        Queue(f"{queue}-plain", Exchange(f"{queue}-plain"), routing_key=f"{queue}-plain"),
        Queue(f"{queue}-slow", Exchange(f"{queue}-slow"), routing_key=f"{queue}-slow"),
        Queue(f"{queue}-events", topic, routing_key="events.#"),
        Queue(f"{queue}-fan1", fanout, routing_key="fan"),
        Queue(f"{queue}-fan2", fanout, routing_key="fan"),
    ]


_conn: redis.Redis | None = None
#: The store and interval queue of the app this process made last (workers and the test).
_where: dict[str, str] = {}


def conn() -> redis.Redis:
    global _conn
    if _conn is None:
        _conn = redis.Redis.from_url(_where["store"])
    return _conn


def record(task: Any, **extra: Any) -> None:
    """Append one body start (store clock and this host's monotonic clock) to the queue's list."""
    mono_ns = time.monotonic_ns()
    seconds, micros = conn().time()
    entry = {
        "name": task.name,
        "id": task.request.id,
        "retries": task.request.retries,
        "us": int(seconds) * 1_000_000 + int(micros),
        "mono_ns": mono_ns,
        "pid": os.getpid(),
        "host": task.request.hostname,
        "eager": bool(task.request.is_eager),
        # the start deadline the worker handed this body (its monotonic ns), if it was paced
        "dl": task.request.get("interval_start_ns"),
        **extra,
    }
    conn().rpush(f"compat:{_where['queue']}", json.dumps(entry))


def first_time(task: Any, what: str) -> bool:
    """True the first time this task id reaches ``what`` (a counter on the store's Redis)."""
    return int(conn().incr(f"compat:{_where['queue']}:{what}:{task.request.id}")) == 1


def both(app: Celery, name: str, **options: Any) -> Callable[[Callable[..., Any]], None]:
    """Register ``fn`` as ``compat.i.<name>`` (IntervalTask) and ``compat.p.<name>`` (Task)."""

    def register(fn: Callable[..., Any]) -> None:
        for kind in KINDS:
            base = IntervalTask if kind == "i" else Task
            # not shared: every app made later in the process would take each define()'s
            # callables, and warn of the same name twice
            app.task(base=base, bind=True, shared=False, name=f"compat.{kind}.{name}", **options)(
                fn
            )

    return register


def sibling(task: Any, name: str) -> str:
    """The task of the same kind as ``task`` called ``name``."""
    return f"compat.{task.name.split('.')[1]}.{name}"


def define(app: Celery) -> None:
    """Every task of the suite, both kinds."""

    @both(app, "add")
    def add(self: Any, x: int, y: int) -> int:
        record(self)
        return x + y

    @both(app, "tsum")
    def tsum(self: Any, values: list[int]) -> int:
        record(self)
        return sum(values)

    @both(app, "replaced")
    def replaced(self: Any, x: int) -> Any:
        record(self)
        raise self.replace(app.signature(sibling(self, "add"), args=(x, 100)))

    @both(app, "reject_once", acks_late=True)
    def reject_once(self: Any, requeue: bool) -> str:
        record(self)
        if first_time(self, "reject"):
            raise Reject("first delivery", requeue=requeue)
        return "second"

    @both(app, "flaky", max_retries=3)
    def flaky(self: Any, fail_times: int) -> int:
        record(self)
        if self.request.retries < fail_times:
            raise self.retry(countdown=0.2)
        return self.request.retries

    @both(app, "autoretry", autoretry_for=(KeyError,), retry_backoff=0.1, retry_jitter=False)
    def autoretry(self: Any, fail_times: int) -> int:
        record(self)
        if self.request.retries < fail_times:
            raise KeyError("again")
        return self.request.retries

    @both(app, "exhaust", max_retries=1)
    def exhaust(self: Any) -> None:
        record(self)
        raise self.retry(countdown=0.1, exc=ValueError("always"))

    @both(app, "sleepy", soft_time_limit=0.5, time_limit=5)
    def sleepy(self: Any, sleep_s: float) -> str:
        record(self)
        try:
            time.sleep(sleep_s)
        except SoftTimeLimitExceeded:
            return "soft"
        return "slept"

    @both(app, "hard_limited", time_limit=0.5)
    def hard_limited(self: Any) -> None:
        record(self)
        time.sleep(10)

    @both(app, "die_once", acks_late=True, reject_on_worker_lost=True)
    def die_once(self: Any) -> str:
        record(self)
        if first_time(self, "die"):
            os._exit(1)
        return "survived"

    @both(app, "quiet", ignore_result=True)
    def quiet(self: Any) -> None:
        record(self)

    @both(app, "slow", acks_late=True)
    def slow(self: Any, sleep_s: float) -> float:
        record(self)
        time.sleep(sleep_s)
        return sleep_s

    @both(app, "limited", rate_limit="100/s")
    def limited(self: Any) -> None:
        record(self)

    @both(app, "prio", acks_late=True)
    def prio(self: Any, label: str) -> str:
        record(self, label=label)
        time.sleep(0.25)  # a worker slow to start its first task lets the other start few
        return label


def _shared(kind: str) -> None:
    """A ``shared_task`` of each kind, defined once per process: every app made since finds
    it (defined in ``make_app``, each new app would name it again)."""
    base = IntervalTask if kind == "i" else Task

    @shared_task(bind=True, name=f"compat.{kind}.shared", base=base)
    def shared(self: Any, x: int) -> int:
        record(self)
        return x * 2


for _kind in KINDS:
    _shared(_kind)

if os.environ.get("CI_TEST_BROKER"):
    app = make_app(
        os.environ["CI_TEST_BROKER"],
        os.environ["CI_TEST_STORE"],
        os.environ["CI_TEST_QUEUE"],
        float(os.environ.get("CI_TEST_INTERVAL", "0.05")),
        **json.loads(os.environ.get("CI_TEST_CONF", "{}")),
    )
    define(app)
