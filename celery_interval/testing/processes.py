"""Real ``celery worker`` processes of a user's app on the test's private Redis, for pool tests.

``python -m celery_interval.testing.processes MODULE:APP [worker options]`` is what each
process runs: it imports the app, points it at ``CELERY_INTERVAL_TESTING_REDIS`` (with the
interval overrides of ``CELERY_INTERVAL_TESTING_INTERVALS``, JSON) and starts ``celery worker``.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery_interval.testing.apps import configure_app, worker_queues

__all__ = ["WorkerProcess", "WorkerProcesses", "main"]

REDIS_ENV = "CELERY_INTERVAL_TESTING_REDIS"
INTERVALS_ENV = "CELERY_INTERVAL_TESTING_INTERVALS"


@dataclass
class WorkerProcess:
    """One ``celery worker`` process and the file its output goes to."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@dataclass
class WorkerProcesses:
    """Starts real workers of an app on ``redis_url``. ``app`` is the same app in this process,
    configured with ``configure_app``: the workers get its ``interval_queues``, and it pings
    them."""

    app: Any
    redis_url: str
    log_dir: Path
    workers: list[WorkerProcess] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        """This process's environment and module path, and the store for the workers."""
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        return {
            **os.environ,
            REDIS_ENV: self.redis_url,
            INTERVALS_ENV: json.dumps(dict(self.app.conf.interval_queues or {})),
            "PYTHONPATH": os.pathsep.join([os.getcwd(), *paths]),
        }

    def start(
        self,
        app_path: str,
        n: int = 2,
        *,
        concurrency: int = 2,
        pool: str = "prefork",
        queues: Sequence[str] | None = None,
        args: Sequence[str] = (),
        timeout_s: float = 60.0,
    ) -> list[WorkerProcess]:
        """Start ``n`` workers of ``app_path`` (``"proj.celery:app"``: the module that defines
        ``self.app``, and its name there), each ``-c concurrency -P pool``, consuming ``queues``
        (default: every interval queue and the default queue); wait until each answers a ping."""
        consumed = ",".join(queues if queues is not None else worker_queues(self.app))
        started: list[WorkerProcess] = []
        for _ in range(n):
            name = f"w{len(self.workers) + len(started) + 1}-{uuid.uuid4().hex[:6]}@localhost"
            log_path = self.log_dir / f"{name}.log"
            cmd = [
                sys.executable, "-m", "celery_interval.testing.processes", app_path,
                "-Q", consumed, "-c", str(concurrency), "-P", pool, "-n", name, "-l", "INFO",
                "--without-gossip", "--without-mingle", *args,
            ]  # fmt: skip
            with log_path.open("wb") as log:
                proc = subprocess.Popen(cmd, env=self.env(), stdout=log, stderr=subprocess.STDOUT)
            started.append(WorkerProcess(name, proc, log_path))
        self.workers.extend(started)
        self.wait_ready([w.name for w in started], timeout_s)
        return started

    def wait_ready(self, names: Sequence[str], timeout_s: float = 60.0) -> None:
        """Wait until every named worker answers ``celery inspect ping``."""
        deadline = time.monotonic() + timeout_s
        pending = set(names)
        while pending and time.monotonic() < deadline:
            for w in self.workers:
                if w.name in pending and w.proc.poll() is not None:
                    raise RuntimeError(f"worker {w.name} exited early:\n{w.log()[-3000:]}")
            try:
                replies = self.app.control.ping(destination=sorted(pending), timeout=0.5) or []
            except OSError:
                time.sleep(0.2)
                continue
            for reply in replies:
                pending -= set(reply)
        if pending:
            logs = "\n".join(w.log()[-2000:] for w in self.workers if w.name in pending)
            raise RuntimeError(f"workers not ready after {timeout_s}s: {pending}\n{logs}")

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM every worker (a warm shutdown), SIGKILL one that outlives ``timeout_s``."""
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in self.workers:
            try:
                w.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait(timeout=timeout_s)


def _load(app_path: str) -> Any:
    module_name, _, attr = app_path.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr or "app")


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``celery worker`` for ``MODULE:APP`` on the test's Redis (see the module doc)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        raise SystemExit("usage: python -m celery_interval.testing.processes MODULE:APP [opts]")
    app = _load(args[0])
    intervals = json.loads(os.environ.get(INTERVALS_ENV) or "{}")
    logging_conf = {
        k: app.conf[k] for k in ("worker_hijack_root_logger", "worker_redirect_stdouts")
    }
    configure_app(app, os.environ[REDIS_ENV], intervals=intervals)
    app.conf.update(logging_conf)  # a worker process logs as the app says (to its log file)
    app.worker_main(["worker", *args[1:]])


if __name__ == "__main__":
    main()
