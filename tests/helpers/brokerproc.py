"""Private brokers that tests may kill and restart: a RabbitMQ node, a Sentinel-managed Redis."""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import amqp

from celery_interval.demo.embedded import _free_port
from tests.helpers.brokers import skip_or_fail
from tests.helpers.failover import SERVICE, SentinelGroup

__all__ = ["RabbitNode", "SentinelBroker", "rabbit_available", "sentinel_broker"]

#: The server scripts, not the /usr/sbin wrappers (those switch to the rabbitmq user and cd).
_RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
_LIVE: set[RabbitNode] = set()  # strong refs: every node is stopped at exit at the latest


def _tool(name: str) -> str | None:
    direct = _RABBIT_BIN / name
    if direct.exists():
        return str(direct)
    return shutil.which(name)


def rabbit_available() -> bool:
    """``rabbitmq-server`` and ``rabbitmqctl`` are installed."""
    return _tool("rabbitmq-server") is not None and _tool("rabbitmqctl") is not None


def _amqp_answers(port: int, timeout_s: float = 2.0) -> bool:
    conn = amqp.Connection(
        f"127.0.0.1:{port}", userid="guest", password="guest", connect_timeout=timeout_s
    )
    try:
        conn.connect()
        return True
    except Exception:
        return False
    finally:
        with contextlib.suppress(Exception):
            conn.collect()


class RabbitNode:
    """A private RabbitMQ node: its own node name, AMQP port, data dir (never the shared one).

    Its Erlang cookie lives in its own HOME, its plugins file enables nothing (no management
    listener to clash with the shared node's), and the system's rabbitmq-env.conf and
    rabbitmq.conf are not read. ``kill()`` SIGKILLs the node's process group (beam and its
    helpers); ``start()`` boots it again on the same port with the same data dir, so durable
    queues and persistent messages come back.
    """

    def __init__(self, tmp: Path | None = None, boot_timeout_s: float = 90.0) -> None:
        if not rabbit_available():
            skip_or_fail("rabbitmq-server / rabbitmqctl are not installed")
        self.boot_timeout_s = boot_timeout_s
        self._own_dir = tmp is None
        base = Path(tempfile.mkdtemp(prefix="ci-rabbit-")) if tmp is None else Path(tmp)
        self.dir = base / f"rabbit-{secrets.token_hex(3)}"
        self.dir.mkdir(parents=True)
        self.nodename = f"ci{secrets.token_hex(4)}@localhost"
        self.port = _free_port()
        self.dist_port = _free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        self.proc: subprocess.Popen[bytes] | None = None
        _LIVE.add(self)
        self._write_config()
        try:
            self.start()
        except BaseException:
            self.stop()
            raise

    def _write_config(self) -> None:
        (self.dir / "home").mkdir()
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\n"
            "loopback_users = none\n"
            "disk_free_limit.absolute = 1MB\n"
            "log.console = false\n"
        )
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq-env.conf").write_text("")

    def env(self) -> dict[str, str]:
        """The environment the node and rabbitmqctl run with."""
        env = dict(os.environ)
        env.update(
            HOME=str(self.dir / "home"),
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_CONF_ENV_FILE=str(self.dir / "rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=str(self.dir / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self.dir / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.dir / "enabled_plugins"),
            RABBITMQ_MNESIA_BASE=str(self.dir / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.dir / "log"),
            RABBITMQ_PID_FILE=str(self.dir / "rabbit.pid"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            ERL_EPMD_ADDRESS="127.0.0.1",
        )
        return env

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ctl(self, *args: str, timeout_s: float = 60.0) -> str:
        """Run ``rabbitmqctl -n <this node> *args``; its output, or RuntimeError."""
        tool = _tool("rabbitmqctl")
        assert tool is not None
        done = subprocess.run(
            [tool, "-n", self.nodename, *args],
            env=self.env(),
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"rabbitmqctl {' '.join(args)} on {self.nodename} exited {done.returncode}: "
                f"{done.stderr.decode('utf-8', 'replace')[-500:]}"
            )
        return done.stdout.decode("utf-8", "replace")

    def _wait_amqp(self) -> None:
        deadline = time.monotonic() + self.boot_timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                break
            if _amqp_answers(self.port):
                return
            time.sleep(0.2)
        raise RuntimeError(f"RabbitMQ node {self.nodename} did not answer on {self.url}")

    def start(self) -> None:
        """Boot the node (first time, or again after ``kill()``) and wait until AMQP answers."""
        if self.alive:
            return
        server = _tool("rabbitmq-server")
        assert server is not None
        log = open(self.dir / "server.out", "ab")  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                [server],
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                start_new_session=True,
            )
        finally:
            log.close()
        try:
            self._wait_amqp()
        except RuntimeError as exc:
            tail = (self.dir / "server.out").read_bytes()[-800:].decode("utf-8", "replace")
            self._signal_group(signal.SIGKILL)
            raise RuntimeError(f"{exc}: {tail}") from None

    def stop_app(self) -> None:
        """``rabbitmqctl stop_app``: every connection drops, the Erlang node stays."""
        self.ctl("stop_app")

    def start_app(self) -> None:
        """``rabbitmqctl start_app``, then wait until AMQP answers."""
        self.ctl("start_app")
        self._wait_amqp()

    def close_connections(self) -> None:
        """``rabbitmqctl close_all_connections``: the broker stays up."""
        self.ctl("close_all_connections", "test: cut every connection")

    def kill(self) -> None:
        """SIGKILL the node's beam process (and the helpers in its process group)."""
        self._signal_group(signal.SIGKILL)

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        """End the node and remove its dir (idempotent)."""
        if self.alive:
            with contextlib.suppress(Exception):
                self.ctl("stop", timeout_s=30)
        self._signal_group(signal.SIGKILL)
        shutil.rmtree(self.dir if not self._own_dir else self.dir.parent, ignore_errors=True)
        _LIVE.discard(self)

    def __enter__(self) -> RabbitNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@atexit.register
def _stop_all() -> None:
    for node in list(_LIVE):
        node.stop()


class SentinelBroker(SentinelGroup):
    """A SentinelGroup (master, replica, three sentinels) as a broker, with the ``sentinel://`` URL
    Celery's broker takes (``broker_transport_options={"master_name": SERVICE}``)."""

    master_name = SERVICE

    def broker_url(self, db: int = 0) -> str:
        return ";".join(f"sentinel://127.0.0.1:{s.port}/{db}" for s in self.sentinels)

    @property
    def transport_options(self) -> dict[str, object]:
        return {"master_name": SERVICE}


@contextlib.contextmanager
def sentinel_broker() -> Iterator[SentinelBroker]:
    group = SentinelBroker()
    try:
        yield group
    finally:
        group.stop()
