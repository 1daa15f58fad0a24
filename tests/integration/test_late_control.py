"""A worker that receives the pause and unpause broadcasts late (its control commands held
behind a gate, as after a cut connection) never undoes a newer command: real workers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from celery_interval import control
from celery_interval.config.table import KEY_PREFIX
from celery_interval.schedule.state import MAX_LEAD_US
from celery_interval.stores.keys import ledger_key
from tests.helpers.assertions import assert_exactly_once, assert_spacing
from tests.helpers.ledgers import claim_admissions_us
from tests.helpers.pool import Pool

INTERVAL_S = 0.05


def _control_writes(pool: Pool) -> list[tuple[str, int]]:
    """(op, store-clock µs) of every pause and unpause the bucket's ledger holds."""
    entries = pool.recorder.xrange(ledger_key(KEY_PREFIX, pool.queue))
    return [
        (fields[b"op"].decode(), int(fields[b"now"]))
        for _id, fields in entries
        if fields.get(b"op") in (b"pause", b"unpause")
    ]


def _wait_handled(log: Path, command: str, queue: str, n: int, timeout_s: float = 60.0) -> None:
    """Until the worker's log shows ``n`` runs of ``command`` for ``queue``."""
    needle = f"interval: control {command} {queue}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.read_text(errors="replace").count(needle) >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"{log.name}: {n} x {needle!r} not seen in {timeout_s}s")


def test_late_broadcasts_never_undo_a_newer_pause(make_pool: Any, tmp_path: Path) -> None:
    pool = make_pool(INTERVAL_S, app_module="tests.helpers.lateapp", loglevel="INFO")
    gate = tmp_path / "control-gate"
    pool.start(2)
    [late] = pool.start(1, CI_TEST_CONTROL_GATE=str(gate))
    ids = pool.send(120)
    pool.wait_records(10, timeout_s=30)
    app, queue = pool.app, pool.queue
    control.pause(app, queue)
    time.sleep(0.5)
    control.unpause(app, queue)
    time.sleep(0.5)
    control.pause(app, queue)
    gate.touch()  # the late worker now runs pause, unpause, pause, in that order
    _wait_handled(late.log_path, "pause_queue", queue, 2)
    _wait_handled(late.log_path, "unpause_queue", queue, 1)
    assert control.status(app, queue).paused is True
    writes = _control_writes(pool)
    assert [op for op, _ in writes] == ["pause", "unpause", "pause"], writes
    stale = [ln for ln in late.log().splitlines() if "came after a newer change" in ln]
    assert any(f"unpause_queue {queue}" in ln for ln in stale), stale
    control.unpause(app, queue)
    records = pool.wait_records(len(ids), timeout_s=120)
    writes = _control_writes(pool)
    assert [op for op, _ in writes] == ["pause", "unpause", "pause", "unpause"], writes
    (p1, u1), (p2, u2) = (writes[0][1], writes[1][1]), (writes[2][1], writes[3][1])
    admissions = claim_admissions_us(pool)
    inside = [(now, start) for now, start in admissions if p1 <= now <= u1 or p2 <= now <= u2]
    assert not inside, f"{len(inside)} starts admitted inside a pause window: {inside[:3]}"
    # A start admitted just before a pause may fall inside it, never more than a lead later.
    leads = [start - now for now, start in admissions if p1 <= start <= u1 or p2 <= start <= u2]
    assert all(lead <= MAX_LEAD_US for lead in leads), leads
    assert_exactly_once(records, ids)
    assert_spacing(pool, records, INTERVAL_S)
