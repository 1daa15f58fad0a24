"""Where a worker's CPU goes at saturation: py-spy samples of a real worker's consumer process
and of one of its pool processes while the demo's pool runs a backlog at the smallest interval.

Run: python bench/profile_worker.py [--tasks 6000] [--seconds 12] [--rate 200]
(needs py-spy, in the bench extra; sampling another process needs ptrace rights, e.g. root).

It starts ``celery-interval demo --workers 1 --interval 0.000001`` (an embedded redis-server as
broker and store, one worker of 2 pool processes), waits for the worker, samples both
processes for ``--seconds`` (``py-spy record --format raw``, idle threads left out) and prints,
for each: the share of samples by the package at the top of the stack, and the package's
functions by the share of samples they are on the stack for (inclusive).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FRAME = re.compile(r"(?P<fn>.*?) \((?P<path>.*?)(?::\d+)?\)$")


def _package(path: str) -> str:
    if "celery_interval/" in path:
        return "celery_interval"
    if "site-packages/" in path:
        return path.split("site-packages/")[-1].split("/")[0]
    return Path(path).name


def summary(raw: str, top: int) -> str:
    """A folded-stacks file (``frame;frame;... count`` a line) as two short tables."""
    total = 0
    leaf: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        frames = [m for m in (FRAME.match(f) for f in stack.split(";")) if m]
        if frames:
            leaf[_package(frames[-1]["path"])] += n
        seen = {
            f"{m['path'].split('celery_interval/')[-1]}:{m['fn']}"
            for m in frames
            if "celery_interval/" in m["path"]
        }
        for key in seen:
            inclusive[key] += n
    out = [f"{total} samples", "on top of the stack, by package:"]
    out += [f"  {100 * n / total:5.1f}%  {k}" for k, n in leaf.most_common(top)]
    out.append("celery_interval functions on the stack:")
    out += [f"  {100 * n / total:5.1f}%  {k}" for k, n in inclusive.most_common(top)]
    return "\n".join(out)


def _pids(parent: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=6000)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--rate", type=int, default=200, help="samples a second")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    spy = shutil.which("py-spy")
    if spy is None:
        sys.exit("py-spy is not installed (pip install py-spy)")
    demo = subprocess.Popen(
        [sys.executable, "-c", "from celery_interval.cli.tool import main; main()", "demo",
         "--workers", "1", "--tasks", str(args.tasks), "--interval", "0.000001",
         "--pause", "0.5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        worker = children = None
        while time.monotonic() < deadline and not children:
            time.sleep(0.5)
            workers = [p for p in _pids(demo.pid) if _pids(p)]
            worker = workers[0] if workers else None
            children = _pids(worker) if worker else []
        if worker is None or not children:
            sys.exit("the demo's worker did not start")
        with tempfile.TemporaryDirectory() as tmp:
            outs = {"consumer": Path(tmp, "consumer.txt"), "pool": Path(tmp, "pool.txt")}
            record = [spy, "record", "-d", str(round(args.seconds)), "-r", str(args.rate)]
            spies = [
                subprocess.Popen(
                    [*record, "-f", "raw", "--nonblocking", "-p", str(pid), "-o", str(out)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for pid, out in zip((worker, children[0]), outs.values(), strict=True)
            ]
            for s in spies:
                s.wait(timeout=args.seconds + 60)
            for name, out in outs.items():
                print(f"== the worker's {name} process")
                print(summary(out.read_text(), args.top))
    finally:
        demo.wait(timeout=300)


if __name__ == "__main__":
    main()
