"""StoreClock: store-clock times onto the local monotonic clock, within the round trip."""

from __future__ import annotations

import random

from celery_interval.worker.clock import StoreClock

OFFSET_NS = 5_000_000_000_000  # store µs * 1000 = local ns + OFFSET_NS


def sample(clock: StoreClock, local_read_ns: int, sent_ns: int, received_ns: int) -> None:
    clock.observe((local_read_ns + OFFSET_NS) // 1000, sent_ns, received_ns)


def test_the_shortest_round_trip_sets_the_offset() -> None:
    clock = StoreClock()
    sample(clock, local_read_ns=1_000_000, sent_ns=0, received_ns=4_000_000)  # skewed, long
    sample(clock, local_read_ns=10_050_000, sent_ns=10_000_000, received_ns=10_100_000)
    start_us = (20_000_000 + OFFSET_NS) // 1000
    got = clock.local_ns(start_us, sent_ns=19_000_000, received_ns=19_900_000, ahead_us=900)
    assert got == 20_000_000, "exact: the best sample read the store mid round trip"


def test_a_mapping_never_leaves_its_own_round_trip() -> None:
    clock = StoreClock()
    sample(clock, local_read_ns=50_000, sent_ns=0, received_ns=100_000)
    clock.observe(10**15, 200_000, 300_000)  # the store clock stepped by hours
    for sent_ns, received_ns in [(400_000, 500_000), (600_000, 2_600_000)]:
        got = clock.local_ns(10**15, sent_ns, received_ns, ahead_us=8_000)
        assert sent_ns + 8_000_000 <= got <= received_ns + 8_000_000


def test_without_samples_the_latest_possible_time() -> None:
    assert StoreClock().local_ns(123, sent_ns=10, received_ns=20, ahead_us=5) == 20 + 5_000


def test_the_best_sample_is_the_shortest_round_trip_of_the_window() -> None:
    """The kept best sample equals a fresh minimum over the last ``window`` samples, as
    samples (ties among them) come and leave the window."""
    rng = random.Random(7)
    clock, window, seen = StoreClock(window=8), 8, []
    for n in range(2_000):
        sent_ns = n * 1_000_000
        rtt_ns = rng.choice([100_000, 200_000, 300_000, rng.randrange(50_000, 900_000)])
        read_ns = sent_ns + rng.randrange(rtt_ns + 1)
        store_us = (read_ns + OFFSET_NS) // 1000 + rng.randrange(-3, 4)
        clock.observe(store_us, sent_ns, sent_ns + rtt_ns)
        seen.append((rtt_ns, store_us * 1000 - (sent_ns + rtt_ns // 2)))
        _, offset_ns = min(seen[-window:])
        far = 10**12
        assert clock.local_ns(store_us, 0, 2 * far, ahead_us=0) == store_us * 1000 - offset_ns
