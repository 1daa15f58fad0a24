"""How late this machine runs a waiting process right now: a pool child's wait, without Celery.

Run beside a test's workers: ``python wakeprobe.py OUT INTERVAL_US``. Every interval it waits
for a monotonic deadline exactly as a pool process waits for its start (``wait_until`` with the
library's spin) and appends ``deadline_ns late_ns`` to OUT, until SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import time
from types import FrameType

from celery_interval.worker.process.started import spin_ns_for, wait_until

FLUSH_EVERY = 25


def main() -> None:
    out_path, interval_us = sys.argv[1], int(sys.argv[2])
    interval_ns, spin_ns = interval_us * 1000, spin_ns_for(interval_us)
    stopping = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    with open(out_path, "a", buffering=1) as out:
        lines: list[str] = []
        deadline_ns = time.monotonic_ns() + interval_ns
        while not stopping:
            wait_until(deadline_ns, spin_ns)
            late_ns = time.monotonic_ns() - deadline_ns
            lines.append(f"{deadline_ns} {late_ns}\n")
            if len(lines) >= FLUSH_EVERY:
                out.writelines(lines)
                lines.clear()
            # A wake later than a whole interval skips the deadlines it missed (no burst).
            deadline_ns += interval_ns * (1 + late_ns // interval_ns)
        out.writelines(lines)


if __name__ == "__main__":
    main()
