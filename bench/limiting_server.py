"""A local HTTP API enforcing a token bucket its clients are not told: 429 with Retry-After."""

from __future__ import annotations

import argparse
import contextlib
import email.utils
import json
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

#: The environment variable through which bench workers find the server's base URL.
ENV_API = "BENCH_API_URL"
#: How a 429 names its wait: integer seconds (ceil), an HTTP date, or no Retry-After at all.
RETRY_AFTER_MODES = ("seconds", "date", "none")


@dataclass
class TokenBucket:
    """Rate ``rate`` tokens per second, at most ``burst`` tokens; starts full."""

    rate: float
    burst: float
    tokens: float = field(init=False)
    at: float = field(init=False)

    def __post_init__(self) -> None:
        check_limit(self.rate, self.burst)
        self.tokens = float(self.burst)
        self.at = time.monotonic()

    def _refill(self, now: float) -> None:
        self.tokens = min(float(self.burst), self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = max(self.at, now)

    def take(self, now: float) -> float:
        """0.0 when a token was taken, else the seconds until one will be there."""
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate

    def set_limit(self, rate: float, burst: float, now: float) -> None:
        """A new limit from ``now`` on; tokens already there stay, capped at the new burst."""
        check_limit(rate, burst)
        self._refill(now)
        self.rate, self.burst = rate, burst
        self.tokens = min(self.tokens, float(burst))


def check_limit(rate: float, burst: float) -> None:
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be a positive number of tokens per second, not {rate!r}")
    if not (burst >= 1 and math.isfinite(burst)):
        raise ValueError(f"burst must be at least 1 token, not {burst!r}")


class Limiter:
    """The server's state: the bucket, and every request's outcome on its clock."""

    def __init__(self, rate: float, burst: float) -> None:
        self._lock = threading.Lock()
        self.bucket = TokenBucket(rate, burst)
        self.origin = time.monotonic()
        self.origin_wall = time.time()
        #: (seconds since origin, accepted) per counted request, in the order decided.
        self.events: list[tuple[float, bool]] = []
        #: (seconds since origin, rate, burst): the limit in force from then on.
        self.limits: list[tuple[float, float, float]] = [(0.0, rate, burst)]

    def decide(self) -> float:
        """Count one request: 0.0 if accepted, else the seconds until a token."""
        with self._lock:
            now = time.monotonic()
            wait = self.bucket.take(now)
            self.events.append((now - self.origin, wait == 0.0))
            return wait

    def set_limit(self, rate: float, burst: float) -> None:
        with self._lock:
            now = time.monotonic()
            self.bucket.set_limit(rate, burst, now)
            self.limits.append((now - self.origin, rate, burst))

    def reset(self, rate: float | None = None, burst: float | None = None) -> None:
        """Forget every count, start the clock again, and refill the bucket (a new limit too)."""
        with self._lock:
            rate = self.bucket.rate if rate is None else rate
            burst = self.bucket.burst if burst is None else burst
            self.bucket = TokenBucket(rate, burst)
            self.origin = time.monotonic()
            self.origin_wall = time.time()
            self.events = []
            self.limits = [(0.0, rate, burst)]

    def stats(self, *, events: bool = False) -> dict[str, Any]:
        """Totals, a per-second series, the limit changes, and (``events``) every request."""
        with self._lock:
            elapsed = time.monotonic() - self.origin
            seen = list(self.events)
            limits = list(self.limits)
            rate, burst = self.bucket.rate, self.bucket.burst
        seconds = max(int(elapsed) + 1, int(seen[-1][0]) + 1 if seen else 0)
        series = [{"t": s, "accepted": 0, "rejected": 0} for s in range(seconds)]
        for t, ok in seen:
            series[int(t)]["accepted" if ok else "rejected"] += 1
        accepted = sum(1 for _, ok in seen if ok)
        out: dict[str, Any] = {
            "rate": rate,
            "burst": burst,
            "elapsed_s": elapsed,
            "origin_unix_s": self.origin_wall,
            "totals": {"accepted": accepted, "rejected": len(seen) - accepted},
            "series": series,
            "limits": [{"t": t, "rate": r, "burst": b} for t, r, b in limits],
        }
        if events:
            out["events"] = [[round(t, 6), int(ok)] for t, ok in seen]
        return out


def throttle_headers(wait_s: float, mode: str, reset_headers: bool) -> dict[str, str]:
    """The headers of a 429 whose next token comes in ``wait_s`` seconds (> 0)."""
    whole = max(1, math.ceil(wait_s))  # integer seconds, rounded up, as real APIs send
    headers: dict[str, str] = {}
    if mode == "seconds":
        headers["Retry-After"] = str(whole)
    elif mode == "date":
        headers["Retry-After"] = email.utils.formatdate(
            math.ceil(time.time() + wait_s), usegmt=True
        )
    elif mode != "none":
        raise ValueError(f"retry-after mode {mode!r}; known: {', '.join(RETRY_AFTER_MODES)}")
    if reset_headers:
        headers["RateLimit-Reset"] = str(whole)  # IETF draft: delta seconds
        headers["X-RateLimit-Reset"] = str(math.ceil(time.time() + wait_s))  # epoch seconds
    return headers


def parse_retry_after(headers: Mapping[str, str], now_unix_s: float | None = None) -> float | None:
    """Seconds to wait from a 429's headers (Retry-After, then RateLimit-Reset, then
    X-RateLimit-Reset), or None when none is there or readable; never negative."""
    now = time.time() if now_unix_s is None else now_unix_s
    value = _header(headers, "Retry-After")
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            when = None
        if when is not None:
            return max(0.0, when.timestamp() - now)
    value = _header(headers, "RateLimit-Reset")
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            pass
    value = _header(headers, "X-RateLimit-Reset")
    if value:
        try:
            return max(0.0, float(value) - now)
        except ValueError:
            pass
    return None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:  # a plain dict: look case-insensitively
        value = next((v for k, v in headers.items() if k.lower() == name.lower()), None)
    return value.strip() if isinstance(value, str) else None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client's session reuses its connection
    timeout = 60  # an idle kept-alive connection is closed after this
    disable_nagle_algorithm = True  # headers and body go out at once, no delayed-ACK stall
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(
        self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _query(self) -> dict[str, str]:
        return {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/admin/stats":
            events = self._query().get("events", "0") not in ("", "0", "false")
            self._send(200, self.server.limiter.stats(events=events))
            return
        if path.startswith("/admin/"):
            self._send(404, {"error": f"no such admin endpoint {path}"})
            return
        wait = self.server.limiter.decide()
        if self.server.latency_s:
            time.sleep(self.server.latency_s)
        if wait == 0.0:
            self._send(200, {"ok": True})
        else:
            headers = throttle_headers(wait, self.server.retry_after, self.server.reset_headers)
            self._send(429, {"error": "rate limited"}, headers)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        path = urlsplit(self.path).path
        query = self._query()
        limiter = self.server.limiter
        try:
            rate = float(query["rate"]) if "rate" in query else None
            burst = float(query["burst"]) if "burst" in query else None
            if path == "/admin/limit":
                limiter.set_limit(
                    limiter.bucket.rate if rate is None else rate,
                    limiter.bucket.burst if burst is None else burst,
                )
            elif path == "/admin/reset":
                limiter.reset(rate, burst)
            else:
                self._send(404, {"error": f"no such admin endpoint {path}"})
                return
        except ValueError as exc:
            self._send(400, {"error": str(exc)})
            return
        self._send(200, {"rate": limiter.bucket.rate, "burst": limiter.bucket.burst})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], limiter: Limiter) -> None:
        super().__init__(address, _Handler)
        self.limiter = limiter
        self.retry_after = "seconds"
        self.reset_headers = True
        self.latency_s = 0.0


class LimitingServer:
    """The server in a background thread: ``with LimitingServer(rate=10, burst=5) as s: s.url``."""

    def __init__(
        self,
        *,
        rate: float,
        burst: float,
        host: str = "127.0.0.1",
        port: int = 0,
        retry_after: str = "seconds",
        reset_headers: bool = True,
        latency_s: float = 0.0,
    ) -> None:
        if retry_after not in RETRY_AFTER_MODES:
            raise ValueError(f"retry_after={retry_after!r}; known: {RETRY_AFTER_MODES}")
        self.limiter = Limiter(rate, burst)
        self._server = _Server((host, port), self.limiter)
        self._server.retry_after = retry_after
        self._server.reset_headers = reset_headers
        self._server.latency_s = latency_s
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self._server.server_address[0]
        return f"http://{host}:{self.port}"

    def start(self) -> LimitingServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"limiting-server-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted (the command line)."""
        try:
            self._server.serve_forever(poll_interval=0.2)
        finally:
            self._server.server_close()

    def __enter__(self) -> LimitingServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8429, help="0: any free port")
    parser.add_argument("--rate", type=float, default=10.0, help="tokens per second")
    parser.add_argument("--burst", type=float, default=5.0, help="bucket size in tokens")
    parser.add_argument("--retry-after", choices=RETRY_AFTER_MODES, default="seconds")
    parser.add_argument(
        "--no-reset-headers",
        action="store_true",
        help="send no RateLimit-Reset / X-RateLimit-Reset on a 429",
    )
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added to each API call")
    args = parser.parse_args(argv)
    server = LimitingServer(
        rate=args.rate,
        burst=args.burst,
        host=args.host,
        port=args.port,
        retry_after=args.retry_after,
        reset_headers=not args.no_reset_headers,
        latency_s=args.latency_ms / 1e3,
    )
    print(
        f"limiting server on {server.url}: {args.rate:g}/s, burst {args.burst:g}; "
        f"POST /admin/limit?rate=R&burst=B, POST /admin/reset, GET /admin/stats[?events=1]",
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
