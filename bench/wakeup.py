"""How late does this machine wake a sleeping process? No Celery: plain sleeps to deadlines.

Run: python bench/wakeup.py [--burners N]. Prints lateness percentiles of 6 processes x 300
sleeps of 15 ms, the share later than 3 ms, with N busy processes beside them.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from typing import Any

SLEEP_NS = 15_000_000


def sleeper(results: Any, count: int) -> None:
    late_ms = []
    for _ in range(count):
        deadline_ns = time.monotonic_ns() + SLEEP_NS
        time.sleep(SLEEP_NS / 1e9)
        late_ms.append((time.monotonic_ns() - deadline_ns) / 1e6)
    results.put(late_ms)


def burner(stop: Any) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(10_000):
            x += 1
        time.sleep(0.0005)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--burners", type=int, default=0)
    parser.add_argument("--sleeps", type=int, default=300)
    args = parser.parse_args()
    results: Any = mp.Queue()
    stop = mp.Event()
    burners = [mp.Process(target=burner, args=(stop,)) for _ in range(args.burners)]
    sleepers = [mp.Process(target=sleeper, args=(results, args.sleeps)) for _ in range(6)]
    for p in burners + sleepers:
        p.start()
    late = sorted(x for _ in sleepers for x in results.get())
    stop.set()
    for p in burners + sleepers:
        p.join()
    n = len(late)
    print(
        f"burners={args.burners} sleeps={n} late_ms p50={late[n // 2]:.2f} "
        f"p99={late[int(n * 0.99)]:.2f} p99.9={late[int(n * 0.999)]:.2f} max={late[-1]:.2f} "
        f"over_3ms={sum(1 for x in late if x > 3) / n:.2%}"
    )


if __name__ == "__main__":
    main()
