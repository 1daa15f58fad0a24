"""Start and stop a Spark standalone cluster or a Spark Connect server from the installed PySpark.

    python tools/spark_cluster.py start [--workers 2] [--cores 1] [--memory 1g] [--connect]
    python tools/spark_cluster.py stop
    python tools/spark_cluster.py run [--workers 2] [--connect] -- python job.py

Everything runs from PySpark's own install (SPARK_HOME is the ``pyspark`` package folder; its
``bin/spark-class`` and ``bin/spark-submit`` ship in the wheel) on 127.0.0.1 and free ports:

- a standalone cluster: one master (``org.apache.spark.deploy.master.Master``) and ``--workers``
  workers (``org.apache.spark.deploy.worker.Worker``) of ``--cores`` cores and ``--memory`` each;
  ``start`` returns once the master's ``/json/`` lists every worker ALIVE;
- with ``--connect``, a Spark Connect server (``SparkConnectServer``, from the wheel's
  ``spark-connect`` jar) whose Spark runs on that cluster (or with ``--workers 0`` on
  ``local[2]``); ``start`` returns once its gRPC port answers.

``start`` prints the URLs as JSON (``master``, ``remote``: ``spark://…`` and ``sc://…``) and
keeps them, with the process ids, in a state file (``--state``); ``stop`` ends those processes.
``run`` starts, runs the command with ``SPARK_MASTER_URL`` (and ``SPARK_CONNECT_URL``) set, and
stops. Every process gets this one's Python (``PYSPARK_PYTHON``) and ``PYTHONPATH``, so the
executors import the same code as the driver. Logs go to ``--log-dir`` (a temporary folder by
default). From Python: ``with standalone(workers=2) as cluster: ...`` and ``connect_server``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
STATE = Path(tempfile.gettempdir()) / "celery-interval-spark-cluster.json"
CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home() -> Path:
    """The installed PySpark's folder, which holds Spark's ``bin/`` and ``jars/``."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def missing() -> str | None:
    """Why no cluster can start here (no PySpark, no Java, no Spark Connect jar), or None."""
    try:
        home = spark_home()
    except ImportError:
        return "PySpark is not installed (pip install 'celery-interval[spark]')"
    java_home = os.environ.get("JAVA_HOME", "")
    if not shutil.which("java") and not os.access(Path(java_home) / "bin" / "java", os.X_OK):
        return "Spark needs Java 17 or later: no `java` on PATH and no JAVA_HOME/bin/java"
    if not os.access(home / "bin" / "spark-class", os.X_OK):
        return f"{home}/bin/spark-class is missing: this PySpark has no Spark launcher"
    return None


def missing_connect() -> str | None:
    """Why no Spark Connect server or client can run here, or None."""
    why = missing()
    if why is not None:
        return why
    if not any((spark_home() / "jars").glob("spark-connect_*.jar")):
        return "this PySpark ships no spark-connect jar (PySpark 4 does)"
    try:
        from pyspark.sql.connect.utils import check_dependencies

        check_dependencies()
    except ImportError as exc:
        return f"the Spark Connect client needs pyspark[connect]'s packages: {exc}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every Spark process: this Python and its import path."""
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(spark_home()),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        SPARK_CONNECT_MODE="0",  # the JVM side: never turn the launchers into Connect clients
        SPARK_LOCAL_IP=HOST,
        SPARK_NO_DAEMONIZE="1",
    )
    env.pop("SPARK_REMOTE", None)
    env.update(extra or {})
    return env


def _spawn(args: Sequence[str], log: Path, env: Mapping[str, str]) -> int:
    """Start ``args`` in its own process group (so ``stop`` ends its JVM children too)."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(args), stdout=out, stderr=subprocess.STDOUT, env=dict(env), start_new_session=True
        )
    return proc.pid


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)  # reap our own child, if it is one
    except ChildProcessError:
        waited = 0
    if waited == pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Cluster:
    """What ``start`` started: the URLs, the process ids and where the logs are."""

    master: str | None = None
    web: str | None = None
    remote: str | None = None
    pids: list[int] = field(default_factory=list)
    logs: str = ""
    workers: int = 0

    def stop(self, timeout_s: float = 20) -> None:
        """End every process this cluster started (its process group), newest first."""
        for pid in reversed(self.pids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for pid in self.pids:
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        self.pids = []


def _wait_for(what: str, ready: object, pid: int, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            raise RuntimeError(f"{what} exited while starting; its log {log}:\n{_tail(log)}")
        if callable(ready) and ready():
            return
        time.sleep(0.3)
    raise RuntimeError(f"{what} not ready in {timeout_s:.0f} s; its log {log}:\n{_tail(log)}")


def alive_workers(web: str) -> int:
    """How many workers the master at ``web`` (its web UI) lists ALIVE, from ``/json/``."""
    try:
        with urllib.request.urlopen(f"{web}/json/", timeout=2) as reply:
            doc = json.load(reply)
    except (OSError, ValueError):
        return -1
    return sum(w.get("state") == "ALIVE" for w in doc.get("workers", []))


def _answers(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1):
            return True
    except OSError:
        return False


def start(
    workers: int = 2,
    cores: int = 1,
    memory: str = "1g",
    connect: bool = False,
    log_dir: str | Path | None = None,
    conf: Mapping[str, str] | None = None,
    timeout_s: float = 120,
    local: str = "local[2]",
) -> Cluster:
    """Start a master and ``workers`` workers (none when 0) and, with ``connect``, a Spark
    Connect server on them (on ``local`` without workers, e.g. ``local[2,2]``: 2 threads, a
    failed task tried twice); ``conf`` goes to the server."""
    why = missing_connect() if connect else missing()
    if why is not None:
        raise RuntimeError(why)
    logs = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="spark-cluster-"))
    logs.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(logs=str(logs), workers=workers)
    spark_class = str(spark_home() / "bin" / "spark-class")
    env = _env()
    try:
        if workers > 0:
            port, web_port = free_port(), free_port()
            cluster.master, cluster.web = f"spark://{HOST}:{port}", f"http://{HOST}:{web_port}"
            log = logs / "master.log"
            master = [spark_class, "org.apache.spark.deploy.master.Master"]
            args = ["--host", HOST, "--port", str(port), "--webui-port", str(web_port)]
            cluster.pids.append(_spawn([*master, *args], log, env))
            _wait_for("the master", lambda: alive_workers(str(cluster.web)) >= 0,
                      cluster.pids[-1], log, timeout_s)  # fmt: skip
            for n in range(workers):
                work = logs / f"worker-{n}"
                work.mkdir(exist_ok=True)
                worker = [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", HOST,
                          "--webui-port", str(free_port()), "--cores", str(cores), "--memory",
                          memory, "--work-dir", str(work), cluster.master]  # fmt: skip
                cluster.pids.append(_spawn(worker, logs / f"worker-{n}.log", env))
            _wait_for(f"{workers} workers", lambda: alive_workers(str(cluster.web)) == workers,
                      cluster.pids[0], logs / "master.log", timeout_s)  # fmt: skip
        if connect:
            port = free_port()
            submit = [str(spark_home() / "bin" / "spark-submit"), "--class", CONNECT_CLASS,
                      "--name", "Spark Connect server", "--master", cluster.master or local,
                      "--conf", f"spark.connect.grpc.binding.port={port}",
                      "--conf", f"spark.connect.grpc.binding.address={HOST}",
                      "--conf", "spark.ui.enabled=false"]  # fmt: skip
            for key, value in (conf or {}).items():
                submit += ["--conf", f"{key}={value}"]
            log = logs / "connect.log"
            cluster.pids.append(_spawn([*submit, "spark-internal"], log, env))
            _wait_for("the Spark Connect server", lambda: _answers(port), cluster.pids[-1], log,
                      timeout_s)  # fmt: skip
            cluster.remote = f"sc://{HOST}:{port}"
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def standalone(
    workers: int = 2, cores: int = 1, memory: str = "1g", **kw: object
) -> Iterator[Cluster]:
    """A master and ``workers`` workers for the ``with`` block, stopped after it."""
    cluster = start(workers, cores, memory, **kw)  # type: ignore[arg-type]
    try:
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def connect_server(workers: int = 0, **kw: object) -> Iterator[Cluster]:
    """A Spark Connect server (on ``local[2]``, or on a cluster of ``workers``) for the block."""
    cluster = start(workers, connect=True, **kw)  # type: ignore[arg-type]
    try:
        yield cluster
    finally:
        cluster.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("start", "stop", "run"))
    parser.add_argument("--workers", type=int, default=2, help="0: no cluster (Connect on local)")
    parser.add_argument("--cores", type=int, default=1, help="cores of each worker")
    parser.add_argument("--memory", default="1g", help="memory of each worker's executors")
    parser.add_argument("--connect", action="store_true", help="also start a Connect server")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting of the Connect server")  # fmt: skip
    parser.add_argument("--log-dir", help="where the logs go (default: a temporary folder)")
    parser.add_argument("--state", default=str(STATE), help="the state file start writes")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    state = Path(args.state)
    if args.action == "stop":
        if not state.exists():
            print(f"nothing to stop: no {state}", file=sys.stderr)
            return 1
        Cluster(**json.loads(state.read_text())).stop()
        state.unlink()
        return 0
    conf = dict(kv.split("=", 1) for kv in args.conf)
    cluster = start(args.workers, args.cores, args.memory, args.connect, args.log_dir, conf)
    if args.action == "start":
        state.write_text(json.dumps(asdict(cluster)) + "\n")
        print(json.dumps(asdict(cluster), indent=1))
        return 0
    try:
        urls = {"SPARK_MASTER_URL": cluster.master, "SPARK_CONNECT_URL": cluster.remote}
        env = {**os.environ, **{k: v for k, v in urls.items() if v}}
        return subprocess.run(command, env=env, check=False).returncode if command else 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
