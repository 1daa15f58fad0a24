"""The adaptive pace against a token-bucket server, simulated with the model's own functions.

Run: python bench/adaptive_sim.py [--seconds 120] [--rate 10] [--burst 5] [--believed 15]

One client paced by ``schedule.effective_interval`` calls a token bucket (rate, burst) that
halves its rate at half time; a refused call pauses the pace for Retry-After (whole seconds,
at least one) and slows it (``schedule.slowed``), an accepted one eases it (``schedule.eased``),
as the store does. No servers, no clock: it shows what the constants do over a long run.
"""

from __future__ import annotations

import argparse
import math

from celery_interval import schedule
from celery_interval.config.intervals import US_PER_S


def run(seconds: float, rate: float, burst: float, believed: float) -> dict[str, float]:
    """429 share and goodput (÷ the server's limit) before and after the drop."""
    interval_us = round(US_PER_S / believed)
    state = schedule.new_state(0, interval_us, -(10**9))
    adapt_max_us = 100 * interval_us
    t_s = tokens_at_s = 0.0
    tokens = burst
    counts = {"ok_before": 0, "no_before": 0, "ok_after": 0, "no_after": 0}
    while t_s < seconds:
        limit = rate if t_s < seconds / 2 else rate / 2
        tokens = min(burst, tokens + (t_s - tokens_at_s) * limit)
        tokens_at_s = t_s
        half = "before" if t_s < seconds / 2 else "after"
        if tokens >= 1:
            tokens -= 1
            counts[f"ok_{half}"] += 1
            state = schedule.eased(state, interval_us)
            t_s += schedule.effective_interval(state, interval_us) / US_PER_S
        else:
            counts[f"no_{half}"] += 1
            state = schedule.slowed(state, interval_us, adapt_max_us)
            t_s += max(1, math.ceil((1 - tokens) / limit))  # Retry-After, then its own retry
    calls = sum(counts.values())
    return {
        "share_429": (counts["no_before"] + counts["no_after"]) / calls,
        "goodput": (counts["ok_before"] + counts["ok_after"]) / (seconds / 2 * rate * 1.5),
        "goodput_before": counts["ok_before"] / (seconds / 2 * rate),
        "goodput_after": counts["ok_after"] / (seconds / 2 * rate / 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--burst", type=float, default=5.0)
    parser.add_argument("--believed", type=float, default=15.0)
    args = parser.parse_args()
    for seconds in (20.0, args.seconds):
        figures = run(seconds, args.rate, args.burst, args.believed)
        print(f"{seconds:g} s: " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
