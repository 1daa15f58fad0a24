"""The bench's limiting HTTP server over real HTTP: 429s, Retry-After, its bound, admin calls."""

from __future__ import annotations

import email.utils
import http.client
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.limiting import limiting_server

ls = limiting_server()


class Client:
    """One kept-alive HTTP connection to the server, counting what it was answered."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.seen = {200: 0, 429: 0}

    def request(self, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
        self.conn.request(method, path)
        resp = self.conn.getresponse()
        body = resp.read()
        return resp.status, dict(resp.getheaders()), body

    def call(self) -> tuple[int, dict[str, str]]:
        status, headers, _ = self.request("GET", "/api/thing")
        self.seen[status] += 1
        return status, headers

    def stats(self, events: bool = True) -> dict[str, Any]:
        status, _, body = self.request("GET", "/admin/stats?events=1" if events else "/admin/stats")
        assert status == 200
        return dict(json.loads(body))

    def set_limit(self, rate: float, burst: float) -> dict[str, Any]:
        status, _, body = self.request("POST", f"/admin/limit?rate={rate:g}&burst={burst:g}")
        assert status == 200, body
        return dict(json.loads(body))


@pytest.fixture
def server() -> Iterator[Any]:
    with ls.LimitingServer(rate=2.0, burst=3.0) as s:
        yield s


@pytest.fixture
def client(server: Any) -> Iterator[Client]:
    c = Client(server.port)
    yield c
    c.conn.close()


def max_accepted_over_bound(events: list[list[float]], limits: list[dict[str, float]]) -> float:
    """The largest excess, over any window [t_i, t_j] inside one limit's time, of the requests
    accepted in it over burst + rate * (t_j - t_i): never positive for a token bucket."""
    worst = -float("inf")
    bounds = [lim["t"] for lim in limits[1:]] + [float("inf")]
    for lim, end in zip(limits, bounds):
        times = [t for t, ok in events if ok and lim["t"] <= t < end]
        for i in range(len(times)):
            for j in range(i, len(times)):
                excess = (j - i + 1) - (lim["burst"] + lim["rate"] * (times[j] - times[i]))
                worst = max(worst, excess)
    return worst


def call_until_429(client: Client, attempts: int = 500) -> dict[str, str]:
    for _ in range(attempts):
        status, headers = client.call()
        if status == 429:
            return headers
    raise AssertionError(f"no 429 in {attempts} calls (answered {client.seen})")


def test_over_the_limit_answers_429_with_a_parseable_retry_after(
    server: Any, client: Client
) -> None:
    began = time.monotonic()
    headers = call_until_429(client)
    for _ in range(20):
        client.call()
    elapsed = time.monotonic() - began
    retry_after = headers["Retry-After"]
    assert retry_after.isdigit() and int(retry_after) >= 1
    # ceil of the time until a token: at most ceil(1 / rate) seconds
    assert int(retry_after) <= 1
    assert ls.parse_retry_after(headers) == float(retry_after)
    assert int(headers["RateLimit-Reset"]) == int(retry_after)
    assert float(headers["X-RateLimit-Reset"]) >= time.time() - 5
    # The client's own bound: accepted ≤ burst + rate * elapsed (elapsed includes the server's).
    assert client.seen[200] <= 3 + 2 * elapsed


def test_accepted_per_window_never_exceed_the_token_bucket(server: Any, client: Client) -> None:
    for _ in range(60):
        client.call()
    stats = client.stats()
    assert client.seen[429] > 0  # 60 calls over burst 3 at 2/s
    assert max_accepted_over_bound(stats["events"], stats["limits"]) <= 1e-6
    for second in stats["series"]:  # each whole second holds at most burst + rate tokens
        assert second["accepted"] <= 3 + 2


def test_stats_count_what_clients_were_answered(server: Any, client: Client) -> None:
    other = Client(server.port)
    try:
        for _ in range(25):
            client.call()
            other.call()
    finally:
        other.conn.close()
    stats = client.stats()
    accepted = client.seen[200] + other.seen[200]
    rejected = client.seen[429] + other.seen[429]
    assert stats["totals"] == {"accepted": accepted, "rejected": rejected}
    assert accepted + rejected == 50
    assert sum(s["accepted"] for s in stats["series"]) == accepted
    assert sum(s["rejected"] for s in stats["series"]) == rejected
    assert [s["t"] for s in stats["series"]] == list(range(len(stats["series"])))
    assert len(stats["events"]) == 50
    assert stats["rate"] == 2.0 and stats["burst"] == 3.0
    # Admin calls are not counted, nor are unknown admin paths.
    status, _, _ = client.request("GET", "/admin/nothing")
    assert status == 404
    assert client.stats(events=False)["totals"] == stats["totals"]


def test_admin_limit_changes_the_limit_mid_run(server: Any, client: Client) -> None:
    call_until_429(client)
    # Lower it far: from now on at most the one token left (capped at burst 1) is accepted.
    assert client.set_limit(0.001, 1) == {"rate": 0.001, "burst": 1.0}
    before = client.seen[200]
    began = time.monotonic()
    for _ in range(30):
        client.call()
    assert client.seen[200] - before <= 1 + 0.001 * (time.monotonic() - began)
    # Raise it: calls are accepted again, within the new limit's bound.
    client.set_limit(1000, 50)
    for _ in range(2000):
        if client.call()[0] == 200:
            break
    else:
        raise AssertionError("no 200 after the limit was raised")
    stats = client.stats()
    assert [(lim["rate"], lim["burst"]) for lim in stats["limits"]] == [
        (2.0, 3.0),
        (0.001, 1.0),
        (1000.0, 50.0),
    ]
    assert stats["rate"] == 1000.0
    assert max_accepted_over_bound(stats["events"], stats["limits"]) <= 1e-6


def test_admin_rejects_a_bad_limit(client: Client) -> None:
    status, _, body = client.request("POST", "/admin/limit?rate=0&burst=1")
    assert status == 400 and b"rate" in body
    status, _, _ = client.request("POST", "/admin/limit?rate=abc")
    assert status == 400
    assert client.stats(events=False)["rate"] == 2.0


def test_admin_reset_forgets_counts_and_refills(client: Client) -> None:
    call_until_429(client)
    status, _, _ = client.request("POST", "/admin/reset?rate=5&burst=4")
    assert status == 200
    stats = client.stats()
    assert stats["totals"] == {"accepted": 0, "rejected": 0}
    assert stats["limits"] == [{"t": 0.0, "rate": 5.0, "burst": 4.0}]
    assert client.call()[0] == 200  # the bucket starts full


@pytest.mark.parametrize("reset_headers", [True, False])
def test_http_date_mode(reset_headers: bool) -> None:
    with ls.LimitingServer(
        rate=0.5, burst=1, retry_after="date", reset_headers=reset_headers
    ) as server:
        client = Client(server.port)
        try:
            headers = call_until_429(client)
        finally:
            client.conn.close()
    when = email.utils.parsedate_to_datetime(headers["Retry-After"])
    assert when.tzinfo is not None
    wait = ls.parse_retry_after(headers, now_unix_s=time.time())
    assert wait is not None and wait <= 3  # a token within 1 / 0.5 s, rounded up to a second
    assert ("RateLimit-Reset" in headers) is reset_headers
    assert ("X-RateLimit-Reset" in headers) is reset_headers


def test_reset_headers_alone_are_parsed() -> None:
    now = 1_000_000.0
    assert ls.parse_retry_after({"ratelimit-reset": "3"}, now) == 3.0
    assert ls.parse_retry_after({"X-RateLimit-Reset": "1000004"}, now) == 4.0
    assert ls.parse_retry_after({"Retry-After": "garbage"}, now) is None
    assert ls.parse_retry_after({}, now) is None


def test_token_bucket_bound_on_a_fake_clock() -> None:
    bucket = ls.TokenBucket(4.0, 2.0)
    start = bucket.at
    taken = [bucket.take(start + k * 0.01) == 0.0 for k in range(300)]  # 3 s at 100 calls/s
    assert sum(taken) <= 2 + 4 * 3.0
    assert sum(taken) >= 2 + int(4 * 2.99)  # the bucket does refill: one token per 0.25 s
    wait = bucket.take(start + 3.0)
    assert wait == 0.0 or 0.0 < wait <= 1 / 4  # a token at most 1 / rate away
