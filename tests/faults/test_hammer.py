"""8 processes grant and claim on one bucket at once: spacing, unique tickets, nothing lost."""

from __future__ import annotations

import itertools
import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

from celery_interval.errors import StoreUnavailable
from celery_interval.schedule import ClaimTerms, Outcome, Pace
from celery_interval.stores import store_from_url
from celery_interval.stores.base import TaskCopy

PROCESSES = 8
TASKS_EACH = 25
I_US = 5_000
LEASE_US = 30_000_000


def claimant(url: str, worker: int, results: Any) -> None:
    """Grant and claim TASKS_EACH tasks like a worker would; report each OK start."""
    store = store_from_url(url, timeout_s=1.0)
    for i in range(TASKS_EACH):
        task_id, holder = f"w{worker}-t{i}", f"w{worker}"
        grant = None
        while True:
            try:
                if grant is None:
                    grant = store.grant(TaskCopy("hammer", task_id, 0), Pace(I_US))
                    time.sleep(grant.delay_us / 1e6)
                claim = store.claim(
                    TaskCopy("hammer", task_id, 0), I_US, grant.slot, ClaimTerms(holder, LEASE_US)
                )
            except StoreUnavailable:
                time.sleep(0.02)
                continue
            if claim.outcome is Outcome.OK:
                results.put((task_id, grant.ticket, claim.epoch, claim.now_us + claim.delay_us))
                break
            if claim.outcome is Outcome.RETICKET:
                grant = None
            else:
                time.sleep(max(claim.delay_us, 500) / 1e6)
    store.close()


def hammer(url: str, during: Any = None) -> list[tuple[str, int, int, int]]:
    # spawn, not fork: a forked child runs kombu's after-fork hooks on connections an earlier
    # test left in this process (a control broadcast's reply consumer) and can hang there.
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=claimant, args=(url, w, results)) for w in range(PROCESSES)]
    for p in procs:
        p.start()
    got: list[tuple[str, int, int, int]] = []
    deadline = time.monotonic() + 120
    while len(got) < PROCESSES * TASKS_EACH and time.monotonic() < deadline:
        try:
            got.append(results.get(timeout=1))
        except Exception:
            continue
        if during is not None and len(got) == PROCESSES * TASKS_EACH * 2 // 5:
            during()
    for p in procs:
        p.join(timeout=30)
    return got


def check(got: list[tuple[str, int, int, int]]) -> None:
    ids = [g[0] for g in got]
    assert len(ids) == PROCESSES * TASKS_EACH == len(set(ids)), "lost or doubled OK claims"
    per_epoch: dict[int, list[int]] = {}
    for _, ticket, epoch, _ in got:
        per_epoch.setdefault(epoch, []).append(ticket)
    for tickets in per_epoch.values():
        assert len(tickets) == len(set(tickets)), "a ticket was handed out twice"
    starts = sorted(g[3] for g in got)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= I_US, f"two starts {min(gaps)} µs apart < {I_US} µs"


def test_hammer_redis(redis_client: Any, redis_server: Any) -> None:
    check(hammer(redis_server.url))


def test_hammer_file(tmp_path: Path) -> None:
    check(hammer(f"file://{tmp_path}"))


def test_hammer_redis_restarted_mid_run(redis_client: Any, redis_server: Any) -> None:
    got = hammer(redis_server.url, during=redis_server.restart)
    check(got)
    assert len({epoch for _, _, epoch, _ in got}) >= 2, "the restart should start a new epoch"


@pytest.fixture(autouse=True)
def _private_server_back(redis_server: Any) -> Any:
    yield
    if not redis_server.alive:
        redis_server.restart()
