"""The regional-budget simulation keeps the bounds its design claims, and breaks them only where
the design says it would."""

from __future__ import annotations

import importlib.util
import itertools
import math
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("regions_sim", ROOT / "bench" / "regions_sim.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["regions_sim"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


rs = load()
#: Windows checked on top of the table's: a few intervals, a quarter second.
WINDOWS_US = (*rs.WINDOWS_US, 30_000, 250_000)


def short(**changes: Any) -> Any:
    return replace(rs.Scenario(seconds=30.0), **changes)


def starts(run: Any) -> list[int]:
    return sorted(run.start_us.values())


def min_gap_us(times: list[int]) -> int:
    return min(b - a for a, b in itertools.pairwise(times))


def test_busiest_counts_half_open_windows() -> None:
    """The exactness check itself: three starts 10 ms apart fill a 20 ms window with two."""
    assert rs.busiest([0, 10_000, 20_000], 20_000) == 2
    assert rs.busiest([0, 10_000, 20_000], 20_001) == 3
    assert rs.busiest([0, 9_999, 20_000], 10_000) == 2


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("skew_us", [0, 500, 1_000])
def test_leases_never_exceed_the_limit_when_the_guard_covers_the_skew(
    seed: int, skew_us: int
) -> None:
    sc = short(seed=seed, skew_us=skew_us, guard_us=1_000)
    run = rs.run_leased(sc, rs.arrivals(sc))
    times = starts(run)
    assert len(times) > 0.8 * 30 * 85
    assert min_gap_us(times) >= sc.interval_us
    for window_us in WINDOWS_US:
        assert rs.busiest(times, window_us) <= math.ceil(window_us / sc.interval_us), window_us


def test_a_skew_beyond_the_guard_breaks_the_limit_but_not_the_widened_bound() -> None:
    """The check can fail: 5 ms of skew against a 1 ms guard puts starts 6 ms apart, and some
    10 ms window holds two; none holds more than ceil((W + skew) / interval)."""
    sc = short(skew_us=5_000, guard_us=1_000)
    times = starts(rs.run_leased(sc, rs.arrivals(sc)))
    assert min_gap_us(times) < sc.interval_us
    assert rs.busiest(times, 10_000) > 1
    for window_us in WINDOWS_US:
        assert rs.busiest(times, window_us) <= rs.window_bound(sc, window_us, sc.skew_us)


def test_unguarded_leases_stay_within_the_limit_widened_by_the_skew() -> None:
    sc = short(skew_us=800, guard_us=0)
    times = starts(rs.run_leased(sc, rs.arrivals(sc)))
    for window_us in WINDOWS_US:
        assert rs.busiest(times, window_us) <= rs.window_bound(sc, window_us, sc.skew_us)


def test_one_global_store_is_exact() -> None:
    sc = short(skew_us=5_000)
    times = starts(rs.run_global(sc, rs.arrivals(sc)))
    assert min_gap_us(times) >= sc.interval_us


def test_a_static_split_wastes_the_budget_that_leases_move() -> None:
    """Under demand that moves from region to region, the static split serves less than the
    leases and far less than the demand, and its regions' starts coincide."""
    sc = short(partition=None)
    tasks = rs.arrivals(sc)
    static = rs.figures(rs.run_static(sc, tasks))
    leased = rs.figures(rs.run_leased(sc, tasks))
    demand = len(tasks) / (sc.limit_per_s * sc.seconds)
    assert leased.goodput > 0.97 * demand
    assert static.goodput < leased.goodput - 0.05
    assert static.max_in_window[10_000] > 1


def test_a_cut_off_region_runs_out_its_leases_then_stops() -> None:
    """Region C keeps starting until the leases it holds end (sent ``ahead_us`` before a period
    of ``period_us``), then stops until the link is back, and then catches up."""
    sc = short()
    cut0, cut1 = sc.cut_us
    tasks = rs.arrivals(sc)
    run = rs.run_leased(sc, tasks)
    ours = sorted(run.start_us[t.seq] for t in tasks if t.region == "C" and t.seq in run.start_us)
    during = [s for s in ours if cut0 <= s < cut1]
    assert during, "C had leases when it was cut off"
    assert max(during) - cut0 <= sc.ahead_us + sc.period_us
    assert any(s >= cut1 for s in ours)
    f = rs.figures(run)
    assert f.others_in_cut > 0.95
    assert f.cut_drained_s < 10
    glob = rs.figures(rs.run_global(sc, tasks))
    assert glob.cut_last_start_s < 0.2


def test_the_simulation_is_deterministic() -> None:
    sc = short(seconds=10.0)
    once = rs.run_leased(sc, rs.arrivals(sc)).start_us
    assert rs.run_leased(sc, rs.arrivals(sc)).start_us == once
    other = replace(sc, seed=2)
    assert rs.run_leased(other, rs.arrivals(other)).start_us != once
