"""Real replicated stores for failover tests: a Sentinel group, a Redis Cluster with replicas."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis

from celery_interval.demo.embedded import RedisProc, _free_port, _ping, find_redis_server
from tests.helpers.brokers import skip_or_fail

SLOTS = 16384
#: The service the test sentinels watch.
SERVICE = "ci-store"
#: Sentinel: the master is down after this long without a reply; a failover may take this long.
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000
#: Cluster: a node is failing after this long without a reply.
NODE_TIMEOUT_MS = 1000


def _wait(what: str, check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError, OSError):
            last = check()
            if last:
                return last
        time.sleep(0.05)
    raise RuntimeError(f"{what} not reached in {timeout_s}s (last: {last!r})")


def replicate(replica: RedisProc, master: RedisProc) -> None:
    """Make ``replica`` a replica of ``master`` and wait until it has synced."""
    client = redis.Redis(port=replica.port, decode_responses=True)
    try:
        client.config_set("repl-diskless-load", "swapdb")
        client.replicaof("127.0.0.1", master.port)
        _wait(
            "replica sync",
            lambda: client.info("replication").get("master_link_status") == "up",
        )
    finally:
        client.close()


@contextlib.contextmanager
def replica_behind(master: RedisProc, replica: RedisProc, key: str) -> Iterator[None]:
    """A replication lag made for real: the replica stopped (SIGSTOP), and junk written under
    ``key`` (give it the bucket's hash tag on a Cluster) until the replication link is full and
    the master holds at least ``LAG_BUFFER`` bytes more in its output buffer. Whatever the
    master acknowledges inside the block never reaches the replica if the master dies before
    the block ends.

    The junk goes in small values: a replica's ``omem`` counts from the start of the buffer
    block it is sending, and a value makes a block of its size, so one large value would show
    a full buffer while most of it has already gone into the socket."""
    assert replica.proc is not None
    replica.proc.send_signal(signal.SIGSTOP)
    try:
        with contextlib.closing(redis.Redis(port=master.port)) as client:
            chunk = b"x" * LAG_CHUNK
            for i in range(LAG_ROUNDS):
                pipe = client.pipeline(transaction=False)
                for j in range(16):
                    pipe.set(f"{key}:junk:{i}:{j}", chunk)
                pipe.execute()
                buffered = [int(c["omem"]) for c in client.client_list(_type="replica")]
                if buffered and max(buffered) >= LAG_BUFFER + LAG_CHUNK:
                    break
            else:
                raise RuntimeError("the replication link never filled up")
        yield
    finally:
        replica.proc.send_signal(signal.SIGCONT)


#: The junk of ``replica_behind``: values of LAG_CHUNK bytes, 16 a round trip, until the master
#: holds LAG_BUFFER bytes for the stopped replica, for at most LAG_ROUNDS round trips. The
#: stopped replica's socket goes on taking data after the fill (its kernel grows the buffers:
#: up to 3 MiB held back here drained within 0.5 s), so the master holds more than this host's
#: socket buffers can ever take (tcp_rmem 32 MiB, tcp_wmem 4 MiB), and less than a replica's
#: soft output-buffer limit (64 MiB for 60 s).
LAG_CHUNK = 64 << 10
LAG_BUFFER = 48 << 20
LAG_ROUNDS = 512


class SentinelProc:
    """One ``redis-server --sentinel`` watching ``SERVICE`` at ``master_port`` (quorum 2)."""

    def __init__(self, directory: str, master_port: int, quorum: int = 2) -> None:
        self.port = _free_port()
        conf = os.path.join(directory, f"sentinel-{self.port}.conf")
        with open(conf, "w") as f:
            f.write(
                f"port {self.port}\nbind 127.0.0.1\nprotected-mode no\ndir {directory}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} {quorum}\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
        log = open(os.path.join(directory, f"sentinel-{self.port}.log"), "ab")  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                [find_redis_server(), conf, "--sentinel"], stdout=log, stderr=subprocess.STDOUT
            )
        finally:
            log.close()
        deadline = time.monotonic() + 10
        while not _ping(("127.0.0.1", self.port)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                skip_or_fail(f"redis-server --sentinel did not start on port {self.port}")
            time.sleep(0.02)

    def client(self) -> redis.Redis[str]:
        return redis.Redis(port=self.port, decode_responses=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class SentinelGroup:
    """A master, one replica and three sentinels (quorum 2) on free ports, in temp dirs."""

    def __init__(self) -> None:
        self.master = RedisProc()
        self.replica = RedisProc()
        self.sentinels: list[SentinelProc] = []
        try:
            replicate(self.replica, self.master)
            self.sentinels = [SentinelProc(self.master.dir, self.master.port) for _ in range(3)]
            for sentinel in self.sentinels:
                client = sentinel.client()
                _wait(
                    "sentinels knowing each other and the replica",
                    lambda c=client: (
                        int(c.sentinel_master(SERVICE)["num-other-sentinels"]) == 2
                        and c.sentinel_slaves(SERVICE)
                    ),
                )
                client.close()
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        """The store URL: every sentinel, the service."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def master_port(self) -> int:
        """Where the sentinels say the master is now."""
        with contextlib.closing(self.sentinels[0].client()) as client:
            _host, port = client.sentinel_get_master_addr_by_name(SERVICE)
            return int(port)

    def wait_promoted(self, timeout_s: float = 30.0) -> float:
        """Wait until the replica is the master the sentinels name; returns time.monotonic()."""
        _wait("the replica promoted", lambda: self.master_port() == self.replica.port, timeout_s)
        with contextlib.closing(redis.Redis(port=self.replica.port, decode_responses=True)) as c:
            _wait("the replica writable", lambda: c.info("replication")["role"] == "master")
        return time.monotonic()

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        self.replica.stop()
        self.master.stop()


@contextlib.contextmanager
def sentinel_group() -> Iterator[SentinelGroup]:
    group = SentinelGroup()
    try:
        yield group
    finally:
        group.stop()


def assemble_cluster(
    masters: Sequence[RedisProc], replicas: Sequence[RedisProc] = (), timeout_s: float = 30.0
) -> None:
    """Turn one-node clusters into one cluster: ``masters`` share the slots evenly, the i-th
    of ``replicas`` (if any) replicates the i-th master."""
    nodes = [*masters, *replicas]
    clients = [redis.Redis(host="127.0.0.1", port=n.port, decode_responses=True) for n in nodes]
    try:
        bounds = [i * SLOTS // len(masters) for i in range(len(masters) + 1)]
        for i, client in enumerate(clients):
            client.config_set("cluster-node-timeout", NODE_TIMEOUT_MS)  # rejoin after 1 s, not 5
            client.execute_command("CLUSTER RESET", "HARD")  # forget the slots RedisProc added
            client.execute_command("CLUSTER SET-CONFIG-EPOCH", i + 1)
            if i < len(masters):
                client.execute_command("CLUSTER ADDSLOTS", *range(bounds[i], bounds[i + 1]))
        for client in clients[1:]:
            client.execute_command("CLUSTER MEET", "127.0.0.1", nodes[0].port)

        def converged() -> bool:
            infos = [client.execute_command("CLUSTER INFO") for client in clients]
            return all(
                info["cluster_state"] == "ok"
                and int(info["cluster_known_nodes"]) == len(nodes)
                and int(info["cluster_slots_ok"]) == SLOTS
                for info in infos
            )

        _wait("the cluster converged", converged, timeout_s)
        for i, client in enumerate(clients[len(masters) :]):
            client.execute_command("CLUSTER REPLICATE", clients[i].execute_command("CLUSTER MYID"))
        for client in clients[len(masters) :]:
            _wait(
                "cluster replica sync",
                lambda c=client: c.info("replication").get("master_link_status") == "up",
                timeout_s,
            )
    finally:
        for client in clients:
            client.close()


@contextlib.contextmanager
def replicated_cluster(masters: int = 3) -> Iterator[tuple[list[RedisProc], list[RedisProc]]]:
    """``masters`` masters and one replica each, in cluster mode: (masters, replicas)."""
    with ThreadPoolExecutor(2 * masters) as executor:  # each waits ~2 s for its one-node cluster
        nodes = list(executor.map(lambda _: RedisProc(cluster=True), range(2 * masters)))
    try:
        assemble_cluster(nodes[:masters], nodes[masters:])
        yield nodes[:masters], nodes[masters:]
    finally:
        for node in nodes:
            node.stop()


def cluster_url(nodes: list[RedisProc]) -> str:
    return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in nodes)


def slot_owner(nodes: list[RedisProc], key: str) -> int:
    """The index in ``nodes`` of the master serving ``key``'s hash slot now."""
    for node in nodes:
        if not node.alive:
            continue
        with contextlib.closing(redis.Redis(port=node.port, decode_responses=True)) as c:
            slot = int(c.execute_command("CLUSTER KEYSLOT", key))
            for start, end, primary, *_ in c.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    return next(j for j, n in enumerate(nodes) if n.port == int(primary[1]))
    raise RuntimeError(f"no live node serves {key!r}")


def wait_cluster_promoted(replica: RedisProc, timeout_s: float = 30.0) -> None:
    """Until ``replica`` is a master of a cluster whose state is ok (else AssertionError)."""
    client = redis.Redis(port=replica.port, decode_responses=True)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if (
                    client.info("replication")["role"] == "master"
                    and client.execute_command("CLUSTER INFO")["cluster_state"] == "ok"
                ):
                    return
            time.sleep(0.05)
        raise AssertionError(f"the replica on port {replica.port} was not promoted")
    finally:
        client.close()
