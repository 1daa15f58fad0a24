"""Throttled: the wait a 429 names, read from real responses' headers; bad values refused."""

from __future__ import annotations

import email.utils
import urllib.error
import urllib.request
from typing import Any

import pytest

from celery_interval import Throttled
from celery_interval.errors import ConfigurationError
from celery_interval.headers import RESEND_HEADER, SEND_HEADER, stamp_send
from celery_interval.throttled import retry_after_s_of
from tests.helpers.limiting import limiting_server

NOW_S = 1_800_000_000.0


@pytest.mark.parametrize(
    ("headers", "expected_s"),
    [
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after": "1.5"}, 1.5),  # any case
        ({"Retry-After": email.utils.formatdate(NOW_S + 30, usegmt=True)}, 30.0),
        ({"Retry-After": email.utils.formatdate(NOW_S - 30, usegmt=True)}, 0.0),  # passed
        ({"RateLimit-Reset": "12"}, 12.0),
        ({"X-RateLimit-Reset": str(int(NOW_S + 45))}, 45.0),  # a Unix time (GitHub)
        ({"X-RateLimit-Reset": str(int((NOW_S + 2) * 1000))}, 2.0),  # in milliseconds
        ({"X-RateLimit-Reset": "9"}, 9.0),  # seconds to wait
        ({"Retry-After": "3", "RateLimit-Reset": "99"}, 3.0),  # Retry-After first
        ({"Retry-After": "soon", "RateLimit-Reset": "4"}, 4.0),  # unreadable: the next one
        ({"Retry-After": "-5"}, 0.0),
        ({}, None),
        ({"Retry-After": "nan"}, None),
    ],
)
def test_the_wait_headers_name(headers: dict[str, str], expected_s: float | None) -> None:
    found = retry_after_s_of(headers, NOW_S)
    assert found == (None if expected_s is None else pytest.approx(expected_s, abs=1e-6))


def test_from_a_real_429_of_a_real_server() -> None:
    """urllib's HTTPError of a real limiting server: Retry-After in whole seconds."""
    with limiting_server().LimitingServer(rate=0.5, burst=1) as server:
        urllib.request.urlopen(server.url + "/x", timeout=10).close()  # takes the one token
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(server.url + "/x", timeout=10)
    throttled = Throttled.from_response(caught.value)
    assert caught.value.code == 429
    assert 1 <= throttled.retry_after_s <= 2 and throttled.retry_after_us >= 1_000_000
    assert "HTTP 429" in str(throttled)


class Response:
    """The shape of a requests/httpx response: ``status_code`` and ``headers``."""

    def __init__(self, status_code: int, headers: dict[str, str]) -> None:
        self.status_code = status_code
        self.headers = headers


def test_default_and_cap() -> None:
    assert Throttled.from_response(Response(429, {})).retry_after_s == 1.0
    assert Throttled.from_response(Response(503, {}), default_s=5).retry_after_s == 5.0
    far = Throttled.from_response(Response(429, {"Retry-After": "9999999"}))
    assert far.retry_after_s == 86_400  # capped at one day


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), "2", True, None, 86_401])
def test_a_bad_wait_is_refused_naming_it(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"Throttled\(retry_after_s="):
        Throttled(bad)


def test_a_throttled_task_sent_again_keeps_its_send_code() -> None:
    resent = {SEND_HEADER: "abcd1234", RESEND_HEADER: True}
    stamp_send(headers=resent)
    assert resent[SEND_HEADER] == "abcd1234"
    unstamped = {RESEND_HEADER: True}  # sent without a code first: none now either
    stamp_send(headers=unstamped)
    assert SEND_HEADER not in unstamped
    fresh = {SEND_HEADER: "abcd1234"}  # a retry's copied code is renewed
    stamp_send(headers=fresh)
    assert fresh[SEND_HEADER] != "abcd1234"
