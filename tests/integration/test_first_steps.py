"""The first-steps page runs as written: its files, its worker, its sends and what they print.

How ``docs/first-steps.md`` marks what runs, the one convention this test reads:

- a fenced code block whose first line is ``# <relative path>.py`` is that file of the project,
  the whole block as it stands (``# proj/__init__.py`` alone is an empty module);
- a ``console`` block holds commands: each ``$ `` line is one, and the lines after it, up to the
  next, are what it printed; a ``...`` line stands for lines left out.

The test writes the files into a temp dir, points the page's one ``broker=`` URL at the private
Redis (the store follows the broker) and runs the commands in page order, each as the page
writes it, with the temp dir as the current directory: ``pip`` is skipped (the package is
installed here); ``celery ... worker`` starts a real worker in the background; ``python X.py``
runs the script, its sends counted by Celery's ``after_task_publish`` signal; ``celery ...``
(``interval status``, ``control pause_queue``, ...) runs to its end. A command of any other
kind fails the test, so that the page cannot gain a step the test does not run.

After each command the test checks what the page says of it: every printed line the page shows
is in the real output (the page's broker URL read as the test's, a ``celery@host`` node name as
any host), and a table row of ``interval status`` has the page's cells except the columns that
vary from run to run (``VARYING``). The tasks sent while their bucket is not paused all start,
each once; sent while it is paused, none starts until the unpause; and every start, in the
bucket's ledger on the store's clock, is at least the interval the worker's banner names after
the one before.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from celery import Celery
from celery.utils.nodenames import default_nodename

from celery_interval.demo.embedded import RedisProc
from celery_interval.testing import assert_spaced, ledger_starts, wait_for_starts
from celery_interval.testing.processes import WorkerProcess, WorkerProcesses

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "first-steps.md"
#: The private Redis database of this test: broker and store.
DB = 11
COMMAND_TIMEOUT_S = 60.0
#: How long sends to a paused bucket are watched for a start that must not come.
PAUSED_WATCH_S = 1.0
#: Status columns that vary from run to run, and why.
VARYING = {
    "tickets": "a task that had to re-ticket holds two",
    "held": "a worker that answers after the status's inspect timeout shows '?'",
}
#: ``python`` runs the page's script with its sends recorded, one task id a line, to argv[2].
SEND_RECORDER = """
import runpy, sys
from celery.signals import after_task_publish
script, record = sys.argv[1:3]
sent = open(record, "a")
def note(headers=None, **_):
    print(headers["id"], file=sent, flush=True)
after_task_publish.connect(note, weak=False)
sys.argv = [script]
runpy.run_path(script, run_name="__main__")
"""

FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
FILE_LINE = re.compile(r"# (?P<path>[\w./-]+\.py)")
BROKER = re.compile(r"""broker=(["'])(?P<url>[^"']+)\1""")
NODE = re.compile(r"celery@[\w.-]+")
#: A banner line of the worker's ``[interval queues]``: ``  . api: 0.1s (one start every ...``.
BANNER_QUEUE = re.compile(r"^\s*\. (?P<bucket>[^\s:]+): (?P<interval_s>[0-9.e+-]+)s \(", re.M)


@dataclass
class Command:
    """One ``$`` line of the page and the lines it printed there."""

    line: str
    output: list[str] = field(default_factory=list)

    @property
    def words(self) -> list[str]:
        return shlex.split(self.line)


def page_blocks() -> tuple[dict[str, str], list[Command]]:
    """The project's files (path: text) and the commands, in page order."""
    files: dict[str, str] = {}
    commands: list[Command] = []
    for block in FENCE.finditer(PAGE.read_text()):
        body = block["body"]
        named = FILE_LINE.fullmatch(body.splitlines()[0].strip()) if body.strip() else None
        if named:
            files[named["path"]] = body
        elif block["info"].strip() == "console":
            for line in body.splitlines():
                if line.startswith("$ "):
                    commands.append(Command(line[2:].strip()))
                elif commands:
                    commands[-1].output.append(line)
    return files, commands


def write_project(root: Path, files: dict[str, str], broker_url: str) -> str:
    """Write the files under ``root``, their one ``broker=`` URL replaced; returns the page's."""
    found = [(path, m) for path, text in files.items() for m in BROKER.finditer(text)]
    assert len(found) == 1, f"the page's files should set broker= once: {found}"
    page_url = found[0][1]["url"]
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(BROKER.sub(lambda m: f"broker={m[1]}{broker_url}{m[1]}", text))
    return page_url


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"[│┃]", line)[1:-1]]


def check_output(shown: list[str], real: str, page_url: str, test_url: str) -> None:
    """Every line the page shows is in ``real``; table rows match cell by cell (``VARYING``
    aside), under the page's column headers."""

    def norm(line: str) -> str:
        return NODE.sub("celery@HOST", line.replace(page_url, test_url)).strip()

    real_lines = real.splitlines()
    headers = {tuple(cells(line)) for line in real_lines if "┃" in line}
    rows = {row[0]: row for row in (cells(norm(line)) for line in real_lines if "│" in line)}
    columns: tuple[str, ...] = ()
    for line in shown:
        if line.strip() in {"...", ""} or line.lstrip()[:1] in {"┏", "┡", "└"}:
            continue
        if "┃" in line:
            columns = tuple(cells(line))
            assert columns in headers, f"columns {columns} not in:\n{real}"
        elif "│" in line:
            want = dict(zip(columns, cells(norm(line))))
            got = dict(zip(columns, rows.get(want[columns[0]], [])))
            for name in VARYING:
                want.pop(name, None)
                got.pop(name, None)
            assert got == want, f"row {want} printed as {got}:\n{real}"
        else:
            assert norm(line) in {norm(r) for r in real_lines}, f"{line!r} not in:\n{real}"


@pytest.fixture
def broker_url(redis_server: RedisProc) -> Iterator[str]:
    if not redis_server.alive:
        redis_server.restart()
    url = redis_server.broker_url_for(DB)
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    yield url


def test_the_first_steps_page_runs_as_written(broker_url: str, tmp_path: Path) -> None:
    files, commands = page_blocks()
    assert files and commands, f"no project files or commands found in {PAGE}"
    project = tmp_path / "project"
    page_url = write_project(project, files, broker_url)
    reader = Celery("first-steps-reader", broker=broker_url, set_as_current=False)
    workers = WorkerProcesses(reader, broker_url, tmp_path)
    # The checkout on the path, as a ``pip install`` would put the package there.
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    sent: list[str] = []
    paused: set[str] = set()
    bucket, interval_s = "", 0.0

    def all_started() -> None:
        if sent and bucket not in paused:
            starts = wait_for_starts(reader, bucket, len(sent), timeout_s=COMMAND_TIMEOUT_S)
            # each task once: its first start, or its readmit where that replaced it
            ids = [s.task_id for s in starts if not s.readmit]
            ids += sorted({s.task_id for s in starts if s.readmit} - set(ids))
            assert sorted(ids) == sorted(sent)

    try:
        for command in commands:
            words = command.words
            if words[0] == "pip":
                continue
            if words[0] == "celery" and "worker" in words:
                log_path = tmp_path / f"worker{len(workers.workers) + 1}.log"
                with log_path.open("wb") as log:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", *words], cwd=project, env=env,
                        stdout=log, stderr=subprocess.STDOUT,
                    )  # fmt: skip
                worker = WorkerProcess(default_nodename(None), proc, log_path)
                workers.workers.append(worker)
                workers.wait_ready([worker.name])
                check_output(command.output, worker.log(), page_url, broker_url)
                queues = BANNER_QUEUE.findall(worker.log())
                assert len(queues) == 1, f"one interval queue in the banner: {worker.log()}"
                bucket, interval_s = queues[0][0], float(queues[0][1])
                continue
            if words[0] == "python":
                record = tmp_path / "sent.txt"
                before = len(ledger_starts(reader, bucket))
                run = subprocess.run(
                    [sys.executable, "-c", SEND_RECORDER, *words[1:2], str(record)],
                    cwd=project, env=env, capture_output=True, text=True,
                    timeout=COMMAND_TIMEOUT_S,
                )  # fmt: skip
                assert run.returncode == 0, f"{command.line}: {run.stdout}{run.stderr}"
                new = record.read_text().split()
                record.unlink()
                assert new, f"{command.line} sent no task"
                sent += new
                if bucket in paused:
                    time.sleep(PAUSED_WATCH_S)
                    started = len(ledger_starts(reader, bucket)) - before
                    assert started == 0, f"{started} tasks started while {bucket} was paused"
                all_started()
            elif words[0] == "celery":
                all_started()
                run = subprocess.run(
                    [sys.executable, "-m", *words], cwd=project, env=env,
                    capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                )  # fmt: skip
                assert run.returncode == 0, f"{command.line}: {run.stdout}{run.stderr}"
                check_output(command.output, run.stdout, page_url, broker_url)
                if "pause_queue" in words:
                    paused.add(words[-1])
                elif "unpause_queue" in words:
                    paused.discard(words[-1])
                    all_started()
            else:
                pytest.fail(f"the page runs {command.line!r}: teach this test to run it")
    finally:
        workers.stop()
        reader.close()
    assert sent and not paused, f"sent {len(sent)} tasks, still paused: {paused}"
    starts = ledger_starts(reader, bucket)
    assert {s.interval_us for s in starts} == {round(interval_s * 1e6)}
    assert_spaced(starts)
    print(f"FIRST STEPS {len(sent)} tasks, {len(starts)} starts at {interval_s:g}s")
