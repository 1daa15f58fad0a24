"""Security: Redis AUTH, a least-privilege ACL user, TLS with a private CA, one prefix per app."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_interval import control
from celery_interval.demo.embedded import RedisProc, find_redis_server
from celery_interval.errors import ConfigurationError, StoreError, StoreUnavailable
from celery_interval.ledger import LedgerReader
from celery_interval.schedule import Outcome, Pace
from celery_interval.stores import mask_url, store_from_url
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.redis import RedisStore
from tests.helpers.assertions import assert_exactly_once
from tests.helpers.brokers import skip_or_fail
from tests.helpers.pool import Pool, celery_cli, run_once
from tests.helpers.redis_versions import redis7_server
from tests.helpers.store_exercise import DEDUPE_US, INTERVAL_US, exercise
from tests.helpers.tlscerts import TlsFiles, make_tls_files

ADMIN_PASSWORD = "admin-Pw-7f3e"  # requirepass: the default user's password
STORE_PASSWORD = "ci-Pw-91c2"

#: The README's line for the store's own user (PASSWORD replaced). ``~ci:{*`` is exactly the
#: keys of interval_key_prefix ``ci:`` (all are ``<prefix>{<bucket>}…``), not those of ``ci:x:``.
ACL_LINE = (
    "ACL SETUSER ci reset on >PASSWORD ~ci:{* +fcall +function|load +evalsha +script|load"
    " +ping +xrange"
    " +hmget +hset +hdel +get +set +del +xadd +time +pexpire +persist"
    " +zadd +hincrby +zrangebyscore +hget +zrem +zcard +zrange +zremrangebyscore +zscore +zcount"
)
ACL_COMMANDS = tuple(word[1:] for word in ACL_LINE.split() if word.startswith("+"))
#: Without it the store runs its scripts by EVALSHA (``functions.supports``): not needed.
OPTIONAL = "function|load"
#: What ``interval ledger export`` adds: it lists ledgers with SCAN and finds the newest entry.
ACL_EXPORT_EXTRA = "+scan +xrevrange"
#: redis-py sends CLIENT SETINFO on connect and ignores a refusal: the one denial allowed.
IGNORED_DENIALS = {"client", "client|setinfo"}


def set_acl_user(admin: redis.Redis[str], without: str = "", extra: str = "") -> None:
    """(Re)create the store's user exactly as the README says (less ``without``, plus ``extra``)."""
    line = f"{ACL_LINE} {extra}".replace("PASSWORD", STORE_PASSWORD)
    admin.execute_command(*(word for word in line.split() if word != f"+{without}"))


def empty(admin: redis.Redis[str]) -> None:
    """No keys, no cached scripts or functions, no store user, an empty ACL LOG."""
    admin.flushall()
    admin.script_flush()
    admin.function_flush()
    admin.execute_command("ACL", "DELUSER", "ci")
    admin.execute_command("ACL", "LOG", "RESET")


def denials(admin: redis.Redis[str]) -> list[str]:
    """The commands ACL LOG says were refused (its ``object`` field)."""
    entries: list[Any] = admin.execute_command("ACL LOG")
    out = []
    for entry in entries:
        fields = (
            entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2], strict=True))
        )
        out.append(str(fields["object"]))
    return out


# ---------------------------------------------------------------------------------------
# AUTH and ACL: a private redis-server whose default user has a password.
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_server() -> Iterator[RedisProc]:
    """A Redis 7 or later (the ACL line names FCALL, which Redis 6 does not know)."""
    server = RedisProc(binary=redis7_server())
    try:
        redis.Redis(port=server.port).config_set("requirepass", ADMIN_PASSWORD)
        yield server
    finally:
        server.stop()


@pytest.fixture
def admin(auth_server: RedisProc) -> Iterator[redis.Redis[str]]:
    """The default user (admin) of the emptied server."""
    client: redis.Redis[str] = redis.Redis(
        port=auth_server.port, password=ADMIN_PASSWORD, decode_responses=True
    )
    empty(client)
    yield client
    client.close()


def test_a_password_in_the_url_runs_every_operation(
    auth_server: RedisProc, admin: redis.Redis[str]
) -> None:
    exercise(store_from_url(f"redis://:{ADMIN_PASSWORD}@127.0.0.1:{auth_server.port}/0"))
    assert admin.exists("ci:{api}:l")  # the scripts ran on this server (the ledger survives reset)


@pytest.mark.parametrize("given", ["wrong-Secret-42", ""])
def test_a_wrong_or_missing_password_is_named_with_the_url_masked(
    auth_server: RedisProc, admin: redis.Redis[str], given: str
) -> None:
    url = f"redis://:{given}@127.0.0.1:{auth_server.port}/0" if given else auth_server.url
    app = Celery("auth", broker="memory://", set_as_current=False)
    app.conf.update(interval_store_url=url, interval_queues={"api": 1.0})
    for attempt in (store_from_url(url).ping, lambda: control.status(app, "api")):
        with pytest.raises(StoreError) as excinfo:
            attempt()
        message = str(excinfo.value)
        assert mask_url(url) in message, message
        assert "check the user and password of the store URL" in message, message
        assert ADMIN_PASSWORD not in message and (not given or given not in message)
    assert admin.dbsize() == 0


def test_the_acl_user_runs_every_operation(auth_server: RedisProc, admin: redis.Redis[str]) -> None:
    set_acl_user(admin)
    admin.config_resetstat()
    # no library, no cached script: FUNCTION LOAD, the overflow index's SCRIPT LOAD (NOSCRIPT
    # reload) and the posted done marks run too
    exercise(store_from_url(f"redis://ci:{STORE_PASSWORD}@127.0.0.1:{auth_server.port}/0"))
    assert set(denials(admin)) <= IGNORED_DENIALS, denials(admin)
    assert admin.info("commandstats")["cmdstat_fcall"]["calls"] >= 10  # the library's functions


def test_the_acl_user_cannot_touch_keys_outside_its_prefix(
    auth_server: RedisProc, admin: redis.Redis[str]
) -> None:
    set_acl_user(admin)
    url = f"redis://ci:{STORE_PASSWORD}@127.0.0.1:{auth_server.port}/0"
    as_user: redis.Redis[str] = redis.Redis.from_url(url, decode_responses=True)
    for key in ("other:{api}:s", "ci:x:{api}:s", "ci:plain"):
        with pytest.raises(redis.exceptions.NoPermissionError):
            as_user.set(key, "1")
    for command in (("FLUSHALL",), ("KEYS", "*"), ("CONFIG", "GET", "*"), ("EVAL", "return 1", 0)):
        with pytest.raises(redis.exceptions.ResponseError, match=r"(?i)permission"):
            as_user.execute_command(*command)
    for prefix in ("other:", "ci:x:"):  # another app's prefix, even one that starts with ci:
        with pytest.raises(StoreError, match="permission"):
            store_from_url(url, key_prefix=prefix).grant(
                TaskCopy("api", "t1", 0), Pace(INTERVAL_US)
            )
    assert admin.keys("*") == []
    as_user.close()


def test_a_database_other_than_0_also_needs_select(
    auth_server: RedisProc, admin: redis.Redis[str]
) -> None:
    url = f"redis://ci:{STORE_PASSWORD}@127.0.0.1:{auth_server.port}/1"
    set_acl_user(admin)
    with pytest.raises(StoreError, match="select"):
        store_from_url(url).ping()
    set_acl_user(admin, extra="+select")
    exercise(store_from_url(url))


def test_the_ledger_export_as_the_acl_user_needs_scan_and_xrevrange(
    auth_server: RedisProc, admin: redis.Redis[str]
) -> None:
    set_acl_user(admin)
    url = f"redis://ci:{STORE_PASSWORD}@127.0.0.1:{auth_server.port}/0"
    store = store_from_url(url)
    store.grant(TaskCopy("api", "t1", 0), Pace(INTERVAL_US))
    store.close()
    reader = LedgerReader(redis.Redis.from_url(url))
    with pytest.raises(StoreUnavailable):
        reader.buckets()
    set_acl_user(admin, extra=ACL_EXPORT_EXTRA)
    assert reader.buckets() == ["api"]
    assert [record["op"] for record in reader.entries("api")] == ["grant:OK"]
    reader.close()


@pytest.mark.parametrize("command", [c for c in ACL_COMMANDS if c != OPTIONAL])
def test_each_command_of_the_acl_line_is_needed(
    auth_server: RedisProc, admin: redis.Redis[str], command: str
) -> None:
    set_acl_user(admin, without=command)
    store = store_from_url(f"redis://ci:{STORE_PASSWORD}@127.0.0.1:{auth_server.port}/0")
    with pytest.raises(StoreError):
        exercise(store)
    refused = set(denials(admin)) - IGNORED_DENIALS
    assert refused <= {command, command.split("|")[0]} and refused, denials(admin)


def test_a_user_who_may_not_load_functions_runs_the_scripts_by_evalsha(
    auth_server: RedisProc, admin: redis.Redis[str]
) -> None:
    """The line less ``+function|load`` (an ACL written for an older version): every
    operation still runs, by EVALSHA; the one refusal is the library's load."""
    set_acl_user(admin, without=OPTIONAL)
    admin.config_resetstat()
    exercise(store_from_url(f"redis://ci:{STORE_PASSWORD}@127.0.0.1:{auth_server.port}/0"))
    assert set(denials(admin)) - IGNORED_DENIALS <= {OPTIONAL, "function"}, denials(admin)
    stats = admin.info("commandstats")
    assert "cmdstat_fcall" not in stats and stats["cmdstat_evalsha"]["calls"] >= 10, stats


# ---------------------------------------------------------------------------------------
# TLS: a redis-server listening only on a TLS port, its certificate from a throw-away CA.
# ---------------------------------------------------------------------------------------


@dataclass
class TlsServer:
    server: RedisProc
    files: TlsFiles

    def url(self, *, user: str = "", ca: bool = True, client_cert: bool = False) -> str:
        query = [f"ssl_ca_certs={self.files.ca_cert}", "ssl_cert_reqs=required"] if ca else []
        if client_cert:
            query += [
                f"ssl_certfile={self.files.client_cert}",
                f"ssl_keyfile={self.files.client_key}",
            ]
        auth = f"{user}:{STORE_PASSWORD}@" if user else ""
        return f"rediss://{auth}127.0.0.1:{self.server.port}/0" + (
            "?" + "&".join(query) if query else ""
        )

    def admin(self) -> redis.Redis[str]:
        return redis.Redis.from_url(self.url(), decode_responses=True)


def _redis_servers() -> list[str]:
    """The tests' redis-server first, then any other on PATH (one may be built without TLS)."""
    found = [find_redis_server()]
    for directory in os.get_exec_path():
        path = os.path.join(directory, "redis-server")
        if os.access(path, os.X_OK) and all(not os.path.samefile(path, f) for f in found):
            found.append(path)
    return found


def _switch_to_tls(server: RedisProc, files: TlsFiles) -> bool:
    """Serve TLS only, on the server's port; False if this redis-server was built without TLS."""
    client = redis.Redis(port=server.port)
    try:
        client.config_set("tls-cert-file", str(files.server_cert))
        client.config_set("tls-key-file", str(files.server_key))
        client.config_set("tls-ca-cert-file", str(files.ca_cert))
        client.config_set("tls-auth-clients", "optional")
    except redis.exceptions.ResponseError:
        return False
    client.config_set("port", 0)  # the plain listener closes; this connection stays
    client.config_set("tls-port", server.port)
    client.close()
    return True


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    files = make_tls_files(tmp_path_factory.mktemp("tls"))
    chosen = None
    for binary in _redis_servers():
        server = RedisProc(binary=binary)
        if _switch_to_tls(server, files):
            chosen = server
            break
        server.stop()
    if chosen is None:
        skip_or_fail(f"no redis-server built with TLS among {_redis_servers()}")
    assert chosen is not None
    try:
        yield TlsServer(chosen, files)
    finally:
        chosen.stop()


@pytest.fixture
def tls_admin(tls_server: TlsServer) -> Iterator[redis.Redis[str]]:
    client = tls_server.admin()
    empty(client)
    yield client
    client.close()


def test_a_rediss_url_with_the_ca_runs_every_operation(
    tls_server: TlsServer, tls_admin: redis.Redis[str]
) -> None:
    exercise(store_from_url(tls_server.url()))
    assert tls_admin.exists("ci:{api}:l")


def test_without_the_ca_or_without_tls_the_store_refuses_clearly(tls_server: TlsServer) -> None:
    no_ca = tls_server.url(ca=False)
    with pytest.raises(StoreUnavailable) as excinfo:
        store_from_url(no_ca).ping()
    assert mask_url(no_ca) in str(excinfo.value)
    assert "CERTIFICATE_VERIFY_FAILED" in str(excinfo.value)
    cleartext = f"redis://127.0.0.1:{tls_server.server.port}/0"
    with pytest.raises(StoreUnavailable) as excinfo:
        store_from_url(cleartext, timeout_s=2.0).ping()
    assert cleartext in str(excinfo.value)


def test_a_client_certificate_when_the_server_requires_one(
    tls_server: TlsServer, tls_admin: redis.Redis[str]
) -> None:
    tls_admin.config_set("tls-auth-clients", "yes")
    try:
        exercise(store_from_url(tls_server.url(client_cert=True)))
        without = tls_server.url()
        with pytest.raises(StoreUnavailable) as excinfo:
            store_from_url(without).ping()
        assert mask_url(without) in str(excinfo.value)
    finally:
        tls_admin.config_set("tls-auth-clients", "optional")


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("ssl_ca_cert=/etc/ca.pem", "'ssl_ca_cert'"),
        ("ssl_ca_certs=/no/such/ca.pem", "'/no/such/ca.pem'"),
        ("ssl_cert_reqs=sometimes", "sometimes"),
    ],
)
def test_tls_options_are_checked_when_the_store_is_made(query: str, named: str) -> None:
    url = f"rediss://:{STORE_PASSWORD}@127.0.0.1:6390/0?{query}"
    with pytest.raises(ConfigurationError) as excinfo:
        store_from_url(url)
    message = str(excinfo.value)
    assert named in message and mask_url(url) in message and STORE_PASSWORD not in message


@pytest.mark.slow
def test_a_worker_as_the_acl_user_over_tls(
    tls_server: TlsServer, tls_admin: redis.Redis[str], redis_server: RedisProc, tmp_path: Path
) -> None:
    set_acl_user(tls_admin)
    pool = Pool(
        broker=redis_server.broker_url_for(13),
        store=tls_server.url(user="ci"),
        interval_s=0.05,
        tmp=tmp_path,
        record_url=redis_server.url_for(14),
    )
    ids, records = run_once(pool, 10)
    assert_exactly_once(records, ids)
    tickets = sorted(r["ticket"] for r in records)
    assert tickets == list(range(1, 11)), tickets
    assert set(denials(tls_admin)) <= IGNORED_DENIALS, denials(tls_admin)  # start-up ping too
    # the ACL user wrote the ledger: each task's admitted start (a task whose pool process
    # reached it late has a second, readmitted or new, on a loaded machine)
    claimed = {
        f["task"] for _, f in tls_admin.xrange(f"ci:{{{pool.queue}}}:l") if f["op"] == "claim:OK"
    }
    assert claimed == set(ids)


# ---------------------------------------------------------------------------------------
# Two apps on one Redis, told apart by interval_key_prefix.
# ---------------------------------------------------------------------------------------


def test_prefixes_keep_two_stores_on_one_redis_apart(redis_client: redis.Redis[Any]) -> None:
    a = RedisStore(redis_client, key_prefix="appa:")
    b = RedisStore(redis_client, key_prefix="appb:")
    assert [a.grant(TaskCopy("api", f"t{i}", 0), Pace(INTERVAL_US)).ticket for i in range(3)] == [
        1,
        2,
        3,
    ]
    assert [b.grant(TaskCopy("api", f"t{i}", 0), Pace(INTERVAL_US)).ticket for i in range(5)] == [
        1,
        2,
        3,
        4,
        5,
    ]
    a.pause("api", INTERVAL_US)
    assert not b.status("api", INTERVAL_US).paused
    assert not b.grant(TaskCopy("api", "t5", 0), Pace(INTERVAL_US)).paused
    b.set_interval("api", INTERVAL_US, 3 * INTERVAL_US)
    assert not a.status("api", INTERVAL_US).overridden
    t9 = TaskCopy("api", "t9", 0)
    a.done([t9], DEDUPE_US)
    assert b.grant(t9, Pace(INTERVAL_US)).outcome is Outcome.OK  # a's done mark is a's
    a.reset("api")
    assert not a.status("api", INTERVAL_US).exists
    assert b.status("api", INTERVAL_US).ticket == 7
    assert [f["op"] for _, f in a.ledger("api")].count("grant:OK") == 3
    assert [f["op"] for _, f in b.ledger("api")].count("grant:OK") == 7
    a.grant(TaskCopy("only-a", "t1", 0), Pace(INTERVAL_US))
    b.grant(TaskCopy("only-b", "t1", 0), Pace(INTERVAL_US))
    assert LedgerReader(redis_client, "appa:").buckets() == ["api", "only-a"]  # what export lists
    assert LedgerReader(redis_client, "appb:").buckets() == ["api", "only-b"]
    keys = {k.decode() for k in redis_client.keys("*")}
    assert keys and all(k.startswith(("appa:{", "appb:{")) for k in keys), keys


def _cli_status(pool: Pool) -> list[dict[str, Any]]:
    result = celery_cli(pool, "interval", "status", "--json", "--timeout", "0.3")
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, Any]] = json.loads(result.stdout)["queues"]
    return rows


@pytest.mark.slow
def test_two_apps_with_their_own_prefixes_share_one_redis(
    redis_server: RedisProc, tmp_path: Path
) -> None:
    """Same queue name, same store Redis, different prefixes (and brokers): independent."""
    queue = f"shared-{uuid.uuid4().hex[:8]}"
    pools = {}
    for name, db in (("appa", 9), ("appb", 10)):
        (tmp_path / name).mkdir()
        pools[name] = Pool(
            broker=redis_server.broker_url_for(db),
            store=redis_server.url_for(0),
            interval_s=0.05,
            tmp=tmp_path / name,
            queue=queue,
            conf={"interval_key_prefix": f"{name}:"},
            record_url=redis_server.url_for(db + 2),
        )
    a, b = pools["appa"], pools["appb"]
    try:
        for pool in (a, b):
            pool.recorder.flushdb()
            pool.start(1, concurrency=2)
        assert celery_cli(a, "interval", "pause", queue).returncode == 0
        ids_a, ids_b = a.send(6), b.send(4)
        assert_exactly_once(b.wait_records(4), ids_b)
        store_a = RedisStore.from_url(redis_server.url_for(0), key_prefix="appa:")
        deadline = time.monotonic() + 30
        while store_a.status(queue, 50_000).ticket < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # app A's worker takes a ticket per free pool process (-c 2), paused
        rows_a, rows_b = _cli_status(a), _cli_status(b)
        assert [(r["queue"], r["paused"], r["tickets"]) for r in rows_a] == [(queue, True, 2)]
        assert [(r["queue"], r["paused"], r["tickets"]) for r in rows_b] == [(queue, False, 4)]
        assert a.records() == [], "app A's paused bucket started a task"
        assert celery_cli(a, "interval", "unpause", queue).returncode == 0
        assert_exactly_once(a.wait_records(6), ids_a)
        assert [(r["paused"], r["tickets"]) for r in _cli_status(b)] == [(False, 4)]
    finally:
        for pool in (a, b):
            pool.stop()
    conn = redis.Redis.from_url(redis_server.url_for(0))
    keys = {k.decode() for k in conn.scan_iter(match=f"*{{{queue}}}*")}
    conn.close()
    assert keys and all(k.startswith(("appa:", "appb:")) for k in keys), keys
    for name, started in (("appa", 6), ("appb", 4)):
        ledger = RedisStore.from_url(redis_server.url_for(0), key_prefix=f"{name}:").ledger(queue)
        # a task whose pool process came late claims a new start: its task counts once
        assert len({f["task"] for _, f in ledger if f["op"] == "claim:OK"}) == started
