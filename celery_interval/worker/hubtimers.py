"""The worker's event loop polls no longer than its next timer is due, however many fired.

Kombu's hub fires at most ten due timers per turn of the loop (``Hub.fire_timers``); when the
tenth fired, it has no delay in hand and returns its ``min_delay``, one second, and the loop
polls the broker and the pool for that long. A worker holding tasks of many buckets often has
ten timers due at once (claims, waits, polls for a pool process), and its next claims then
wait for a message, a pool result or that second: every worker of a fair outer bucket slept
through the shared limit's free budget until the next publish woke it.
"""

from __future__ import annotations

from time import monotonic
from typing import Any

__all__ = ["poll_until_next_timer"]


def poll_until_next_timer(hub: Any) -> bool:
    """Wrap ``hub.fire_timers`` (before the consumer creates its loop) so that the poll it
    times ends when the soonest timer left is due. Returns whether the hub was wrapped now."""
    if hub is None or getattr(hub, "_interval_polls_to_next_timer", False):
        return False
    fire_timers = hub.fire_timers

    def fire_then_time_the_poll(
        min_delay: float = 1, max_delay: float = 10, max_timers: int = 10, propagate: Any = ()
    ) -> float:
        delay: float = fire_timers(
            min_delay=min_delay, max_delay=max_delay, max_timers=max_timers, propagate=propagate
        )
        queue = getattr(hub.timer, "_queue", None)
        if queue:
            due_s: float = queue[0][0]
            return max(0.0, min(delay, due_s - monotonic()))
        return delay

    hub.fire_timers = fire_then_time_the_poll
    hub._interval_polls_to_next_timer = True
    return True
