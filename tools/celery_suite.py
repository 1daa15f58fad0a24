"""Run Celery's own integration tests (test_tasks, test_canvas) twice at once, each pass on a
private Redis: once with every task an IntervalTask, once with plain Task; print the outcomes
side by side.

    pip install -e ".[dev,celery-suite]"
    python tools/celery_suite.py            # about 40 minutes on 2 cores
    python tools/celery_suite.py -k replace # a subset (pytest -k)

Celery's source distribution of the installed version is downloaded once (pip download) into
``~/.cache/celery_interval``. The IntervalTask run makes ``celery_interval.task:IntervalTask``
the app's task class (every ``shared_task`` of the suite becomes one) and configures the suite's
one queue, ``celery``, as an interval queue. Exit status 1 when a test passes plain and does not
pass on IntervalTask.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import celery
import redis

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "celery_interval"
SUITE = ["t/integration/test_tasks.py", "t/integration/test_canvas.py"]
NEEDED = ("pytest_rerunfailures", "pydantic", "pytest_timeout")
KINDS = ("plain", "interval")

#: Loaded by the suite's pytest run: for the IntervalTask run, the app's task class.
ROOT_CONFTEST = """
import os

import pytest


@pytest.fixture(scope="session")
def celery_parameters():
    if os.environ.get("CELERY_INTERVAL_SUITE") == "interval":
        return {"task_cls": "celery_interval.task:IntervalTask"}
    return {}


@pytest.fixture(scope="session", autouse=True)
def _every_task_is_of_the_run_s_kind(celery_session_app):
    from celery_interval.task import IntervalTask

    want = os.environ.get("CELERY_INTERVAL_SUITE") == "interval"
    # A task declared with a base class of its own keeps it, as in any app.
    wrong = [n for n, t in celery_session_app.tasks.items()
             if n.startswith("t.") and isinstance(t, celery_session_app.Task)
             and isinstance(t, IntervalTask) != want]
    assert not wrong, f"tasks of the wrong kind: {wrong}"
"""


def source_tree() -> Path:
    """The installed Celery version's source tree, downloaded and unpacked once."""
    version = celery.__version__
    root = CACHE / f"celery-{version}"
    if (root / "t" / "integration").is_dir():
        return root
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
         f"celery=={version}", "-d", str(CACHE)],
        check=True,
    )  # fmt: skip
    with tarfile.open(CACHE / f"celery-{version}.tar.gz") as archive:
        archive.extractall(CACHE, filter="data")
    return root


def start(root: Path, kind: str, redis_url: str, extra: list[str]) -> subprocess.Popen[bytes]:
    """Start one pass of the suite on its own Redis (broker, results and store)."""
    env = {
        **os.environ,
        "TEST_BROKER": redis_url,
        "TEST_BACKEND": redis_url,
        "CELERY_INTERVAL_SUITE": kind,
        "PYTHONPATH": os.pathsep.join([str(root), str(REPO)]),
    }
    log = (root / f"log-{kind}.txt").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", *SUITE, "-p", "no:cacheprovider", "-q",
         "--rootdir", str(root), "-o", "addopts=", "--timeout=300",
         f"--junitxml={root / f'report-{kind}.xml'}", *extra],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def claimed_starts(redis_url: str) -> int:
    """OK claims in every bucket's ledger: the starts the store admitted."""
    client = redis.Redis.from_url(redis_url)
    count = 0
    for key in client.scan_iter("ci:{*}:l"):
        entries: Any = client.xrange(key)
        count += sum(fields.get(b"op") == b"claim:OK" for _id, fields in entries)
    return count


def outcomes(report: Path) -> dict[str, str]:
    results: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            results[name] = "failed"
        elif "error" in kinds:
            results[name] = "error"
        elif "skipped" in kinds:
            results[name] = "skipped"
        else:
            results[name] = "passed"
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", help="only tests matching this pytest expression")
    args = parser.parse_args()
    missing = [m for m in NEEDED if not _importable(m)]
    if missing:
        print(f"missing {', '.join(missing)}: pip install -e '.[dev,celery-suite]'")
        return 2
    from celery_interval.demo.embedded import RedisProc

    root = source_tree()
    (root / "conftest.py").write_text(ROOT_CONFTEST)
    # The store is each pass's broker (a Redis): one interval queue, the suite's own.
    (root / "integration-tests-config.json").write_text(
        json.dumps({"interval_queues": {"celery": 0.001}})
    )
    extra = ["-k", args.k] if args.k else []
    servers = {kind: RedisProc() for kind in KINDS}
    started = time.monotonic()
    try:
        passes = {kind: start(root, kind, servers[kind].url_for(0), extra) for kind in KINDS}
        for kind, proc in passes.items():
            proc.wait()
            tail = (root / f"log-{kind}.txt").read_text(errors="replace").splitlines()[-1:]
            starts = claimed_starts(servers[kind].url_for(0))
            print(f"{kind}: {' '.join(tail)}; {starts} starts claimed from the store")
    finally:
        for server in servers.values():
            server.stop()
    print(f"both passes, side by side: {time.monotonic() - started:.0f} s")
    results = {kind: outcomes(root / f"report-{kind}.xml") for kind in KINDS}
    return compare(results["plain"], results["interval"])


def compare(plain: dict[str, str], interval: dict[str, str]) -> int:
    """Print every test whose outcome differs and a count of each pair; 1 on a regression."""
    width = max((len(n) for n in plain), default=10)
    regressions = []
    pairs: dict[tuple[str, str], int] = {}
    for name in sorted(set(plain) | set(interval)):
        a, b = plain.get(name, "absent"), interval.get(name, "absent")
        pairs[(a, b)] = pairs.get((a, b), 0) + 1
        if a != b:
            print(f"{name:<{width}}  plain={a:<8} interval={b}")
        if a == "passed" and b != "passed":
            regressions.append(name)
    print(f"\n{'plain':<8} {'interval':<8} tests")
    for (a, b), count in sorted(pairs.items()):
        print(f"{a:<8} {b:<8} {count}")
    print(f"\n{len(regressions)} test(s) pass plain and not on IntervalTask")
    return 1 if regressions else 0


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
