"""The soak: every feature at once on 3 real workers under a seed's random faults, checked."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.soak_check import Events, check, describe
from tests.helpers.soak_config import Layout
from tests.helpers.soak_faults import FAULTS, schedule_json, schedule_text
from tests.helpers.soak_ledger import resent_unseen
from tests.helpers.soak_run import Result, Soak


def seeds_of(text: str) -> list[int]:
    """``1-20``, ``3,7,9`` or ``5``."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += range(int(low), int(high or low) + 1)
    return seeds


def report(result: Result) -> None:
    print(result.summary(), flush=True)
    if result.ok:
        return
    print(
        f"FAILED seed {result.seed} [{result.broker}]; "
        f"its schedule (rerun with --seeds {result.seed}):"
    )
    print(schedule_text(result.schedule))
    print(json.dumps(schedule_json(result.schedule)))
    for line in result.verdict.lost[:20] + result.verdict.doubled[:20]:
        print(f"  {line}")
    for line in result.verdict.forgotten[:20]:
        print(f"  beyond the promise: {line}")
    for violation in result.verdict.violations[:10]:
        print(describe(violation))
    for finding in result.findings[:5]:
        print(f"  finding: {finding}")


def recheck(path: Path) -> int:
    """Check again the record and events a run left in ``path/soak.json``."""
    dump = json.loads((path / "soak.json").read_text())
    raw = dump["events"]
    ledger = {(e["bucket"], e["id"].encode()): e for e in dump["ledger"]}
    events = Events(
        expected={job: [tuple(step) for step in steps] for job, steps in raw["expected"].items()},
        revoked=set(raw["revoked"]),
        uncertain=set(raw["uncertain"]),
        kills=[tuple(kill) for kill in raw["kills"]],
        ids=raw["ids"],
        excused_ids=set(raw["excused_ids"]),
        received=set(raw.get("received", ())),
        in_ledger={(e["task"], int(e["r"])) for e in ledger.values() if "r" in e},
        resent_unseen=resent_unseen(ledger),
        pops=int(raw.get("pops") or 0),
        losses=raw["losses"],
        returns=raw.get("returns", []),
        pauses=[tuple(p) for p in raw["pauses"]],
        overrides=[tuple(o) for o in raw["overrides"]],
        throttles=[tuple(t) for t in raw["throttles"]],
        wall_offset_ns=int(dump["wall_offset_ns"]),
    )
    verdict = check(dump["records"], events, Layout(dump["prefix"]).rule)
    print(
        f"{path}: steps={verdict.steps} ran={verdict.ran} revoked={verdict.revoked} "
        f"excused={verdict.excused} popped={len(verdict.popped)} "
        f"violations={len(verdict.violations)} "
        f"lost={len(verdict.lost)} doubled={len(verdict.doubled)} "
        f"forgotten={len(verdict.forgotten)}"
    )
    for line in verdict.lost[:20] + verdict.doubled[:20] + verdict.forgotten[:20]:
        print(f"  {line}")
    for violation in verdict.violations[:10]:
        print(describe(violation))
    return 0 if verdict.ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis")
    parser.add_argument("--seeds", default="1-3", help="1-20, 3,7 or 5")
    parser.add_argument("--seconds", type=float, default=120.0, help="faults for this long a seed")
    parser.add_argument(
        "--faults", default=",".join(FAULTS), help=f"the kinds to inject (of {', '.join(FAULTS)})"
    )
    parser.add_argument(
        "--burn", type=int, default=0, help="this many CPU-burning processes beside the soak"
    )
    parser.add_argument(
        "--recheck", type=Path, help="check again the soak.json a run left in this directory"
    )
    args = parser.parse_args(argv)
    if args.recheck:
        return recheck(args.recheck)
    kinds = tuple(k for k in args.faults.split(",") if k)
    unknown = set(kinds) - set(FAULTS)
    if unknown:
        parser.error(f"unknown fault kinds: {sorted(unknown)}")
    kinds_of_total = (
        "jobs",
        "steps",
        "faults",
        "popped",
        "violations",
        "lost",
        "doubled",
        "forgotten",
    )
    totals = dict.fromkeys(kinds_of_total, 0)
    began = time.monotonic()
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burn)
    ]
    try:
        failed = run_seeds(args, kinds, totals)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    print(
        f"TOTAL [{args.broker}] seeds={args.seeds} seconds={args.seconds:g} burn={args.burn} "
        f"took={time.monotonic() - began:.0f}s "
        + " ".join(f"{k}={n}" for k, n in totals.items())
        + f" failed_seeds={failed}"
    )
    return 1 if failed else 0


def run_seeds(
    args: argparse.Namespace, kinds: tuple[str, ...], totals: dict[str, int]
) -> list[int]:
    failed = []
    for seed in seeds_of(args.seeds):
        result = Soak(args.broker, seed, args.seconds, kinds).run()
        report(result)
        v = result.verdict
        totals["jobs"] += result.jobs
        totals["steps"] += v.steps
        totals["faults"] += sum(result.faults.values())
        totals["popped"] += len(v.popped)
        totals["violations"] += len(v.violations)
        totals["lost"] += len(v.lost)
        totals["doubled"] += len(v.doubled)
        totals["forgotten"] += len(v.forgotten)
        if not result.ok:
            failed.append(seed)
    return failed


if __name__ == "__main__":
    sys.exit(main())
