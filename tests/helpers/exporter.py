"""The exporter and ``interval top`` seen from outside: admitted starts written by hand into a
ledger, a real exporter process and its metrics scraped and parsed."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from celery_interval.demo.embedded import _free_port
from celery_interval.ledger import LedgerReader
from tests.helpers.pool import ROOT_DIR, Pool


def write_starts(
    client: Any,
    bucket: str,
    gaps_us: list[int],
    interval_us: int,
    first_us: int | None = None,
    **extra: Any,
) -> int:
    """Admitted starts by hand in ``bucket``'s ledger, 1 ms late each: the first at
    ``first_us`` (default: the last one now, on the store's clock), each next ``gaps_us``
    after the one before, with the ``extra`` fields; the last one's time."""
    reader = LedgerReader(client)
    start = reader.now_us() - sum(gaps_us) if first_us is None else first_us
    for i, gap in enumerate([0, *gaps_us]):
        start += gap
        fields = {"op": "claim:OK", "now": start - 10, "task": f"{bucket}-{i}", "r": 0,
                  "slot": start - 1_000, "holder": "w1/0123456789ab", "start": start,
                  "late": 1_000, "interval": interval_us, **extra}  # fmt: skip
        client.xadd(reader.ledger_key(bucket), fields)  # type: ignore[arg-type]
    return start


def top_shows_the_ledger_and_the_store(run: Any, redis_client: Any) -> None:
    write_starts(redis_client, "api", [1_000_000] * 4, 1_000_000)  # 5 starts in 4 s: ok
    write_starts(redis_client, "mail", [1_000_000], 2_000_000)  # 1 s apart at 2 s: a violation
    assert run("pause", "api").exit_code == 0
    result = run("top", "--json", "--window", "10", "--timeout", "0.2")
    assert result.exit_code == 0, result.output
    frame = json.loads(result.output)
    rows = {row["bucket"]: row for row in frame["buckets"]}
    assert set(rows) == {"api", "mail"} and frame["total"] == 2
    api, mail = rows["api"], rows["mail"]
    assert (api["starts"], api["violations"], api["paused"], api["interval_s"]) == (5, 0, True, 1.0)
    assert (mail["starts"], mail["violations"], mail["paused"], mail["interval_s"]) == (
        2,
        1,
        False,
        2.0,
    )
    assert api["rate_per_s"] == pytest.approx(0.5)  # 5 starts in the last 10 s
    assert api["late_p50_s"] == api["late_p95_s"] == api["last_late_s"] == pytest.approx(0.001)
    assert [row["bucket"] for row in frame["buckets"]] == ["api", "mail"]  # busiest first

    narrowed = json.loads(run("top", "--json", "--match", "m*", "--timeout", "0.2").output)
    assert [row["bucket"] for row in narrowed["buckets"]] == ["mail"]
    table = run("top", "--once", "--top", "1", "--timeout", "0.2")
    assert table.exit_code == 0, table.output
    assert "api" in table.output and "mail" not in table.output.split("interval buckets")[1]
    assert "1 of 2" in table.output


def parse_metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text exposition as {(name, labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name, frozenset(sample.labels.items())] = sample.value
    return out


def values(metrics: dict[Any, float], name: str) -> dict[str, float]:
    """``name``'s value per bucket."""
    return {dict(labels)["bucket"]: v for (n, labels), v in metrics.items() if n == name}


@contextlib.contextmanager
def serving_exporter(pool: Pool, tmp_path: Any) -> Iterator[Any]:
    """A real exporter process of ``pool``'s app; yields a scrape of its metrics."""
    port = _free_port()
    log_path = tmp_path / "exporter.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.helpers.workerapp", "interval", "exporter",
         "--port", str(port), "--addr", "127.0.0.1", "--interval", "0.5", "--timeout", "0.5"],
        cwd=ROOT_DIR, env=pool.env(), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/metrics"

    def scrape() -> dict[Any, float]:
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                return parse_metrics(reply.read().decode())
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{url}: {exc}\n{log_path.read_text()[-3000:]}") from None

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                scrape()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    out = log_path.read_text()
                    raise RuntimeError(f"the exporter did not serve {url}:\n{out}") from None
                time.sleep(0.2)
        yield scrape
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def wait_for(scrape: Any, ok: Any, what: str, timeout_s: float = 60.0) -> dict[Any, float]:
    """Scrape until ``ok(metrics)``; the last scrape (the caller asserts on it)."""
    deadline = time.monotonic() + timeout_s
    metrics = scrape()
    while not ok(metrics) and time.monotonic() < deadline:
        time.sleep(0.25)
        metrics = scrape()
    return metrics
