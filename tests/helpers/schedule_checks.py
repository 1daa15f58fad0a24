"""Properties checked over the model's runs: start spacing and no travel back in time along a
sequence of steps, and every window of starts within its burst's budget."""

from __future__ import annotations

from collections.abc import Iterator

from celery_interval import schedule
from celery_interval.schedule import Lease, Mark
from tests.helpers.schedule_model import I_US, T0_US, Model, Step


def _live_lease(mark: Mark | None, now_us: int, holder: str) -> bool:
    return isinstance(mark, Lease) and mark.holder == holder and mark.expires_real_us > now_us


def _expand(steps: list[Step]) -> Iterator[Step]:
    """Each ``claim_due`` step as ``advance_to_due`` and ``claim`` of the latest grant; each
    ``claim_again`` as the latest claim, with its lead."""
    latest: tuple[str, int] | None = None
    claimed: Step | None = None
    for step in steps:
        if step[0] == "grant":
            latest = (step[1], step[2])
        if step[0] == "claim_again":
            if claimed is not None:
                yield (*claimed[:4], step[1], claimed[5])
        elif step[0] != "claim_due":
            yield step
        elif latest is not None:
            _, holder, lead_us, lease_us, delta_us = step
            yield ("advance_to_due", *latest, lead_us, delta_us)
            claimed = ("claim", *latest, holder, lead_us, lease_us)
            yield claimed
        if step[0] == "claim":
            claimed = step


def check_sequence(steps: list[Step], m: Model | None = None, *, spacing: bool = True) -> Model:
    """Run ``steps`` on a Model, asserting P5 (real start spacing; not with ``spacing=False``,
    for a bucket with a burst) and P8 (within an epoch), and that no start is admitted before a
    throttle's retry_after has passed."""
    m = Model() if m is None else m
    last_start_us: int | None = None  # the latest start, real µs
    before_last_us: int | None = None  # the start before it, real µs
    copy_starts: dict[tuple[str, int], int] = {}  # each copy's latest start, real µs
    quiet_until_us = 0  # the latest throttle's end, real µs
    for step in _expand(steps):
        before = m.state
        effective_us = I_US if before is None else schedule.effective_interval(before, I_US)
        if step[0] == "advance":
            m.now_us += step[1]
            continue
        if step[0] == "advance_to_expiry":
            if m.expires_real_us is not None:
                m.now_us = max(m.now_us, m.expires_real_us + step[1])
            continue
        if step[0] == "advance_to_due":  # jump to where a granted slot comes due, minus a lead
            granted = m.granted.get((step[1], step[2]))
            if granted is not None and before is not None and before.paused_at_real_us is None:
                v_us = schedule.virtual_now(before, m.now_us)
                target_us = m.now_us + granted[1] - v_us - step[3] + step[4]
                m.now_us = max(m.now_us, target_us)
            continue
        if step[0] == "claim":
            task, retries, holder = step[1], step[2], step[3]
            if (task, retries) not in m.granted:
                continue
            lease = m.marks.get((task, retries))
            re_claim = _live_lease(lease, m.now_us, holder)
            n_starts = len(m.starts_real_us)
            m.run([step])
            if len(m.starts_real_us) > n_starts:  # a claim OK, also a lease's holder's again
                start_us = m.starts_real_us[-1] + T0_US
                assert start_us >= quiet_until_us, "a start inside a throttle's retry_after"
            after = m.marks.get((task, retries))
            readmit = (
                re_claim
                and isinstance(lease, Lease)
                and isinstance(after, Lease)
                and after.start_us != lease.start_us
            )
            if len(m.starts_real_us) > n_starts and (readmit or not re_claim):
                assert m.state is not None
                if readmit and last_start_us == copy_starts.get((task, retries)):
                    last_start_us = before_last_us  # the start its holder missed never happened
                if last_start_us is not None and spacing:
                    assert start_us - last_start_us >= effective_us, (
                        f"two starts {start_us - last_start_us} µs apart "
                        f"< interval {effective_us} µs"
                    )
                    start_us = max(start_us, last_start_us)
                before_last_us, last_start_us = last_start_us, start_us
                copy_starts[(task, retries)] = start_us
        else:
            m.run([step])
            if step[0] == "throttle":
                quiet_until_us = max(quiet_until_us, m.now_us + step[3])
        after = m.state
        if before is not None and after is not None and before.epoch == after.epoch:
            assert after.tat_us >= before.tat_us
            assert after.ticket >= before.ticket
            assert after.current_slot_us >= before.current_slot_us
            assert after.last_start_us >= before.last_start_us
            assert after.offset_us >= before.offset_us
    return m


def assert_window_property(m: Model, burst: int, interval_us: int = I_US) -> None:
    """For every window of starts (real time): Σ cost <= burst + span / interval."""
    assert_windows(sorted(m.new_starts), burst, interval_us)


def assert_windows(starts: list[tuple[int, int]], burst: int, interval_us: int) -> None:
    """For every window of ``starts`` ((real µs, cost), sorted): Σ cost <= burst + span /
    interval."""
    for i, (first_us, _) in enumerate(starts):
        total = 0
        for last_us, cost in starts[i:]:
            total += cost
            assert total * interval_us <= burst * interval_us + (last_us - first_us), (
                f"starts {starts[i:]}: {total} units in {last_us - first_us} µs, "
                f"burst {burst} per {interval_us} µs"
            )
