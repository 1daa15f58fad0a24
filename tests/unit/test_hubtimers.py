"""The worker's loop polls no longer than its next timer is due, on kombu's own hub."""

from __future__ import annotations

from kombu.asynchronous import Hub

from celery_interval.worker.hubtimers import poll_until_next_timer

#: When a fired timer's own next timer is due: later than the test runs, however loaded.
ARMED_S = 30.0


def _hub_with_due_timers(due: int) -> tuple[Hub, list[int]]:
    """A hub with ``due`` timers due now; each fired one arms another, due in ``ARMED_S``."""
    hub = Hub()
    fired: list[int] = []

    def fire(i: int) -> None:
        fired.append(i)
        hub.timer.call_after(ARMED_S, fired.append, (-i,))

    for i in range(due):
        hub.timer.call_after(0.0, fire, (i,))
    return hub, fired


def test_kombu_polls_a_second_after_its_tenth_due_timer() -> None:
    """What the wrapper is for: a hub whose tenth timer fired times the poll at one second."""
    hub, fired = _hub_with_due_timers(12)
    assert hub.fire_timers() == 1 and len(fired) == 10
    hub.close()


def test_the_poll_ends_when_the_next_timer_is_due() -> None:
    hub, fired = _hub_with_due_timers(12)
    assert poll_until_next_timer(hub)
    assert hub.fire_timers() == 0.0, "two timers are still due"
    assert len(fired) == 10
    hub.fire_timers()
    assert len(fired) == 12
    assert hub.fire_timers() == hub.timer.max_interval, "a later timer: kombu's own poll"
    assert len(fired) == 12, "the timers the fired ones armed are not due yet"
    assert not poll_until_next_timer(hub), "wrapped once"
    hub.close()


def test_a_hub_without_timers_keeps_its_poll() -> None:
    hub = Hub()
    poll_until_next_timer(hub)
    assert hub.fire_timers() == 1
    assert poll_until_next_timer(None) is False
    hub.close()
