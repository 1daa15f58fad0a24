"""Render the panels of dashboards/celery-interval.json from a real run's exporter data.

Run: python tools/dashboard_png.py [--out dashboards/celery-interval.png] [--json samples.json]

It starts a private redis-server (broker and store), 3 real ``celery worker`` processes of
tools/dashboard_app.py (queue ``api`` at 50 ms; tenants ``api:acme`` and ``api:globex`` at
100 ms) and the real exporter (``celery -A tools.dashboard_app interval exporter``). It sends
a backlog, pauses ``api`` for 4 s, later sets its interval to 0.1 s with ``interval set``,
scrapes /metrics every second meanwhile, and draws each dashboard panel with matplotlib, its
PromQL evaluated on the scraped samples (rate and increase over 5 s, histogram_quantile by
linear interpolation in the bucket, as Prometheus does). Not a Grafana screenshot.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from celery_interval.demo.embedded import RedisProc, _free_port  # noqa: E402

Sample = tuple[float, dict[str, list[tuple[dict[str, str], float]]]]
WINDOW_S = 5.0


def celery(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "tools.dashboard_app", *args]


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def run(seconds: float) -> list[Sample]:
    """One real run; the samples scraped from the exporter, seconds since the first."""
    with RedisProc() as server:
        env = {
            **os.environ,
            "DASHBOARD_BROKER": server.broker_url_for(1),
            "DASHBOARD_STORE": server.url_for(0),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        port = _free_port()
        procs = [
            subprocess.Popen(
                celery(
                    "worker",
                    "-Q",
                    "api",
                    "-c",
                    "2",
                    "-n",
                    f"host{n}@dash",
                    "-l",
                    "WARNING",
                    "--without-gossip",
                    "--without-mingle",
                    "-E",  # task events: the store call times the exporter reads
                ),
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for n in range(3)
        ]
        procs.append(
            subprocess.Popen(
                celery(
                    "interval",
                    "exporter",
                    "--port",
                    str(port),
                    "--addr",
                    "127.0.0.1",
                    "--interval",
                    "1",
                ),
                cwd=ROOT,
                env=env,
            )
        )
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            os.environ.update(env)
            from tools.dashboard_app import app, call_api, tenant_call

            deadline = time.monotonic() + 60
            while len(app.control.ping(timeout=0.5) or []) < 3:
                if time.monotonic() > deadline:
                    raise RuntimeError("workers not ready in 60 s")
            with app.producer_or_acquire() as producer:
                for i in range(450):
                    call_api.apply_async((i,), producer=producer)
                for i in range(150):
                    for tenant in ("acme", "globex"):
                        tenant_call.apply_async((tenant, i), producer=producer)
            samples: list[Sample] = []
            began = time.monotonic()
            actions: dict[float, tuple[str, ...]] = {
                8.0: ("interval", "pause", "api"),
                12.0: ("interval", "unpause", "api"),
                20.0: ("interval", "set", "api", "0.1"),
            }
            while (elapsed := time.monotonic() - began) < seconds:
                for at in [a for a in actions if a <= elapsed]:
                    subprocess.run(celery(*actions.pop(at)), cwd=ROOT, env=env, check=True,
                                   stdout=subprocess.DEVNULL)  # fmt: skip
                with contextlib.suppress(OSError):  # the exporter is still starting
                    samples.append((elapsed, scrape(url)))
                time.sleep(max(0.0, 1.0 - (time.monotonic() - began - elapsed)))
            return samples
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()


# --- PromQL on the samples -------------------------------------------------------------------


def series(samples: list[Sample], name: str, by: str) -> dict[str, list[tuple[float, float]]]:
    """``sum by (by) (name)`` at each sample."""
    out: dict[str, dict[float, float]] = {}
    for t, metrics in samples:
        for labels, value in metrics.get(name, []):
            group = out.setdefault(labels.get(by, ""), {})
            group[t] = group.get(t, 0.0) + value
    return {k: sorted(v.items()) for k, v in out.items()}


def over_window(points: list[tuple[float, float]], per_s: bool) -> list[tuple[float, float]]:
    """``rate`` (per_s) or ``increase`` over WINDOW_S of a counter's points."""
    out = []
    for i, (t, v) in enumerate(points):
        older = [(t0, v0) for t0, v0 in points[:i] if t0 <= t - WINDOW_S]
        if older:
            t0, v0 = older[-1]
            out.append((t, (v - v0) / (t - t0) if per_s else v - v0))
    return out


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus's histogram_quantile of cumulative ``(le, count)`` pairs."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = le, count
    return lower


def quantiles(samples: list[Sample], name: str, by: str, q: float) -> dict[str, list[Any]]:
    """``histogram_quantile(q, sum by (by, le) (rate(name_bucket[5s])))`` at each sample."""
    per: dict[tuple[str, float], dict[float, float]] = {}
    for t, metrics in samples:
        for labels, value in metrics.get(name + "_bucket", []):
            key = (labels.get(by, ""), float(labels["le"]))
            per.setdefault(key, {})[t] = per.get(key, {}).get(t, 0.0) + value
    rated: dict[str, dict[float, list[tuple[float, float]]]] = {}
    for (group, le), points in per.items():
        for t, v in over_window(sorted(points.items()), per_s=True):
            rated.setdefault(group, {}).setdefault(t, []).append((le, v))
    out: dict[str, list[Any]] = {}
    for group, by_t in rated.items():
        pts = [(t, quantile(q, bs)) for t, bs in sorted(by_t.items())]
        out[group] = [(t, v) for t, v in pts if v is not None]
    return out


def panels(samples: list[Sample]) -> dict[int, tuple[dict[str, list[Any]], str]]:
    """Each dashboard panel's lines (by its id), and a note when it has no data."""
    starts = series(samples, "celery_interval_starts_total", "bucket")
    violations = series(samples, "celery_interval_claim_violations_total", "bucket")
    gaps = series(samples, "celery_interval_ledger_gaps_total", "bucket")
    lines: dict[int, dict[str, list[Any]]] = {
        1: {b: over_window(p, per_s=True) for b, p in starts.items()},
        2: series(samples, "celery_interval_interval_seconds", "bucket"),
        3: series(samples, "celery_interval_held", "bucket"),
        4: series(samples, "celery_interval_waiting", "bucket"),
        5: series(samples, "celery_interval_paused", "bucket"),
        6: {
            f"p{int(q * 100)} {b}": pts
            for q in (0.5, 0.95)
            for b, pts in quantiles(
                samples, "celery_interval_start_lateness_seconds", "bucket", q
            ).items()
        },
        7: {
            **{b: over_window(p, per_s=False) for b, p in violations.items()},
            **{f"ledger gaps {b}": over_window(p, per_s=False) for b, p in gaps.items()},
        },
        8: {
            f"p{int(q * 100)} {op}": pts
            for q in (0.5, 0.95)
            for op, pts in quantiles(samples, "celery_interval_store_call_seconds", "op", q).items()
        },
    }
    notes = {8: "no data: the workers of this run sent no interval-* events (task events off)"}
    return {
        pid: (ls, notes.get(pid, "no data") if not any(ls.values()) else "")
        for pid, ls in lines.items()
    }


def render(samples: list[Sample], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dashboard = json.loads((ROOT / "dashboards" / "celery-interval.json").read_text())
    data = panels(samples)
    spec = sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    fig, axes = plt.subplots(4, 2, figsize=(13, 12), sharex=True)
    for ax, panel in zip(axes.flat, spec):
        lines, note = data[panel["id"]]
        unit = panel["fieldConfig"]["defaults"]["unit"]
        scale = 1000.0 if unit == "s" and panel["id"] in (6, 8) else 1.0
        for label, pts in sorted(lines.items()):
            if pts:
                ax.plot([t for t, _ in pts], [v * scale for _, v in pts], label=label, lw=1.2,
                        drawstyle="steps-post" if panel["id"] in (2, 5) else "default")  # fmt: skip
        suffix = {"reqps": " (starts/s)", "s": " (ms)" if scale != 1.0 else " (s)"}.get(unit, "")
        ax.set_title(panel["title"] + suffix, fontsize=10, loc="left")
        ax.grid(alpha=0.3)
        if note:
            ax.text(0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center", color="grey")
        elif lines:
            ax.legend(fontsize=7, loc="upper right")
    for ax in axes[-1]:
        ax.set_xlabel("seconds into the run")
    fig.suptitle(
        "celery_interval dashboard panels, rendered with matplotlib from the exporter's /metrics "
        "during a real run (not a Grafana screenshot)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "dashboards" / "celery-interval.png"))
    parser.add_argument("--seconds", type=float, default=40.0, help="how long to scrape")
    parser.add_argument("--json", default="", help="also write the scraped samples here")
    parser.add_argument("--from-json", default="", help="render saved samples, run nothing")
    args = parser.parse_args()
    if args.from_json:
        samples = [tuple(s) for s in json.loads(Path(args.from_json).read_text())]
    else:
        samples = run(args.seconds)
    if args.json:
        Path(args.json).write_text(json.dumps(samples))
    render(samples, Path(args.out))  # type: ignore[arg-type]
    print(f"wrote {args.out} from {len(samples)} scrapes")


if __name__ == "__main__":
    main()
