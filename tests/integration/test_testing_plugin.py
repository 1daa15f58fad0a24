"""The pytest plugin users test their own interval tasks with: the documented example passes, a
spacing check on a real run fails when the starts are closer than it asks, and the in-thread
worker keeps the interval on the bodies' own clock."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_interval import IntervalTask
from celery_interval.demo.embedded import RedisProc
from celery_interval.testing import (
    Start,
    assert_spaced,
    configure_app,
    ledger_starts,
    start_interval_worker,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run_pytest(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """A separate ``python -m pytest`` (its own private redis-server, its own workers)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_documented_example_passes() -> None:
    """``examples/test_weather.py`` as ``docs/testing.md`` shows it, run as a user runs it."""
    proc = run_pytest(str(EXAMPLES / "test_weather.py"))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "5 passed" in proc.stdout, proc.stdout[-2000:]


VIOLATION = """
from celery_interval.testing import configure_app
import weather
import pytest

@pytest.fixture
def interval_app(interval_redis_url):
    return configure_app(weather.app, interval_redis_url, intervals={"weather": 0.05})

def test_asks_for_more_than_the_queue_gives(interval_worker, interval_control):
    results = [weather.fetch_forecast.delay(c) for c in ("a", "b", "c", "d")]
    assert [r.get(timeout=30) for r in results]
    interval_control.assert_spaced("weather", 0.2)  # the queue runs at 0.05 s: too close
"""


def test_a_check_on_a_real_run_fails_when_starts_are_too_close(tmp_path: Path) -> None:
    """The same fixtures, a queue at 50 ms, a check that asks for 200 ms: the test fails,
    naming the starts that came too close (the check reads the real ledger)."""
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(EXAMPLES)!r})\n"
        "pytest_plugins = ['celery_interval.testing']\n"
    )
    (tmp_path / "test_violation.py").write_text(VIOLATION)
    proc = run_pytest("--rootdir", str(tmp_path), str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "1 failed" in proc.stdout
    assert "not spaced as promised" in proc.stdout and "interval 200.000 ms" in proc.stdout


def test_the_default_interval_app_asks_to_be_overridden(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text("pytest_plugins = ['celery_interval.testing']\n")
    (tmp_path / "test_forgot.py").write_text("def test_forgot(interval_control):\n    pass\n")
    proc = run_pytest("--rootdir", str(tmp_path), str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-4000:]
    assert "override the interval_app fixture" in proc.stdout


def test_the_check_itself() -> None:
    """Spaced and in order passes; too close, or a later ticket first, fails."""
    good = [Start(0, 1, interval_us=50_000), Start(50_000, 2, interval_us=50_000)]
    assert_spaced(good)
    assert_spaced(good, "20/s")
    with pytest.raises(AssertionError, match="apart"):
        assert_spaced(good, 0.051)
    with pytest.raises(AssertionError, match="out of ticket order"):
        assert_spaced([Start(0, 2), Start(60_000, 1)], 0.05)
    assert_spaced([Start(0, 2), Start(60_000, 1)], 0.05, in_order=False)


@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_the_in_thread_worker_keeps_the_interval(
    redis_server: RedisProc, redis_client: Any, pool: str
) -> None:
    """``start_interval_worker`` (Celery's ``start_worker`` in a thread) runs the bootstep as
    ``celery worker`` does: admitted starts an interval apart on the store's clock, in the
    order sent (the bodies' own gaps on this host's clock are printed)."""
    interval_s, n = 0.1, 8
    app = Celery("plugin_probe", set_as_current=False)
    app.conf.interval_queues = {"probe": interval_s}
    app.conf.task_default_queue = "probe"
    body_ns: list[int] = []

    @app.task(base=IntervalTask, name="plugin_probe.body", shared=False)
    def body(i: int) -> int:
        body_ns.append(time.monotonic_ns())
        return i

    configure_app(app, redis_server.url)
    with start_interval_worker(app, pool=pool):
        results = [body.delay(i) for i in range(n)]
        assert [r.get(timeout=60) for r in results] == list(range(n))
    starts = ledger_starts(app, "probe")
    assert_spaced(starts, interval_s)
    by_ticket = sorted(starts, key=lambda s: (s.epoch, s.ticket))
    assert list(dict.fromkeys(s.task_id for s in by_ticket)) == [r.id for r in results]
    gaps_ms = [(b - a) / 1e6 for a, b in itertools.pairwise(sorted(body_ns))]
    assert len(gaps_ms) == n - 1
    # the bodies' own clock: how late a loaded host wakes them is not the library's
    print(f"BODY GAPS ms {[round(g, 1) for g in gaps_ms]}")
