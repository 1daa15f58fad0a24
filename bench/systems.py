"""The systems the bench runs, each the same workload: W worker processes, 2 executors each."""

from __future__ import annotations

import sys
from collections.abc import Callable

from harness import Servers, System, worker_env
from recording import ENV_BROKER, ENV_CONF, ENV_RATE_LIMIT, ENV_TASK, QUEUE

from celery_interval.demo.app import make_app

#: In the order the bench reports them.
COMPARED = (
    "celery_interval",
    "celery_rate_limit",
    "celery_rate_limit_per_worker",
    "diy_set_nx_retry",
    "dramatiq_bucket",
)
CONCURRENCY = 2


def dramatiq_missing() -> str | None:
    """Why ``dramatiq_bucket`` cannot run here, or None when it can."""
    try:
        import dramatiq  # noqa: F401
        import redis  # noqa: F401  (dramatiq[redis])
    except ImportError as exc:
        return f"dramatiq[redis] is not installed ({exc}); pip install 'celery-interval[bench]'"
    return None


def build(
    name: str, servers: Servers, interval_s: float, workers: int, conf_json: str = "{}"
) -> System:
    """The system ``name`` (one of COMPARED, or ``celery_plain``) on ``servers``."""
    per_s = 1 / interval_s
    celery_systems = {
        "celery_interval": ("bench.interval", ""),
        "celery_rate_limit": ("bench.rate_limited", f"{per_s:g}/s"),
        "celery_rate_limit_per_worker": ("bench.rate_limited", f"{per_s / workers:g}/s"),
        "diy_set_nx_retry": ("bench.diy", ""),
        "celery_plain": ("bench.plain", ""),
    }
    if name == "dramatiq_bucket":
        return _dramatiq(servers, interval_s, workers)
    if name not in celery_systems:
        raise ValueError(f"unknown system {name!r}; known: {', '.join(COMPARED)}, celery_plain")
    task, rate_limit = celery_systems[name]
    env = worker_env(
        servers, interval_s, **{ENV_TASK: task, ENV_RATE_LIMIT: rate_limit, ENV_CONF: conf_json}
    )
    return System(
        name=name,
        commands=[_celery_worker(n) for n in range(workers)],
        env=env,
        ready_count=workers * (CONCURRENCY + 1),
        enqueue=celery_enqueue(task, interval_s),
        has_ledger=name == "celery_interval",
    )


def _celery_worker(n: int) -> list[str]:
    return [
        sys.executable, "-m", "celery", "-A", "workload_celery", "worker", "-Q", QUEUE,
        "-P", "prefork", "-c", str(CONCURRENCY), "-n", f"w{n + 1}@bench", "-l", "WARNING",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip


def celery_enqueue(task: str, interval_s: float) -> Callable[[Servers, int], None]:
    """Send ``tasks`` messages of ``task`` through one producer, as fast as it goes."""

    def enqueue(servers: Servers, tasks: int) -> None:
        app = make_app(servers.broker_url, servers.store_url, QUEUE, interval_s)
        with app.producer_or_acquire() as producer:
            for i in range(tasks):
                app.send_task(task, args=(i,), producer=producer)

    return enqueue


def _dramatiq(servers: Servers, interval_s: float, workers: int) -> System:
    # Dramatiq's RedisBroker takes a redis-py URL (kombu's is redis+socket://).
    broker_url = servers.measured.url_for(1)

    def enqueue(servers: Servers, tasks: int) -> None:
        from dramatiq import Message
        from dramatiq.brokers.redis import RedisBroker

        broker = RedisBroker(url=broker_url)
        for i in range(tasks):
            broker.enqueue(
                Message(
                    queue_name=QUEUE, actor_name="bench_limited", args=(i,), kwargs={}, options={}
                )
            )
        broker.close()

    command = [
        sys.executable, "-m", "dramatiq", "workload_dramatiq", "-p", str(workers),
        "-t", str(CONCURRENCY),
    ]  # fmt: skip
    return System(
        name="dramatiq_bucket",
        commands=[command],
        env=worker_env(servers, interval_s, **{ENV_BROKER: broker_url}),
        ready_count=workers,
        enqueue=enqueue,
    )
