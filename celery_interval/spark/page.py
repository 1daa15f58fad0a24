"""The audit's report.html: the summary table of every bucket and the plots beside it."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["limits_text", "write_report"]

#: (summary field, column heading, format) of the table, in order.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("bucket", "bucket", "{}"),
    ("starts", "starts", "{:,}"),
    ("violations", "violations", "{}"),
    ("duplicate_starts", "duplicate starts", "{}"),
    ("limits", "limits: violations", "{}"),
    ("interval_s", "interval s", "{:g}"),
    ("min_gap_s", "min gap s", "{:.6f}"),
    ("p1_gap_s", "p1 gap s", "{:.6f}"),
    ("p50_gap_s", "p50 gap s", "{:.6f}"),
    ("rate_per_s", "rate /s", "{:.3f}"),
    ("configured_rate_per_s", "configured /s", "{:.3f}"),
    ("utilization", "utilization", "{:.3f}"),
    ("late_p50_s", "late p50 s", "{:.6f}"),
    ("late_p95_s", "late p95 s", "{:.6f}"),
    ("late_p99_s", "late p99 s", "{:.6f}"),
    ("late_max_s", "late max s", "{:.6f}"),
    ("retickets", "retickets", "{}"),
    ("dedupe_drops", "dedupe drops", "{}"),
    ("waits", "waits", "{}"),
    ("pauses", "pauses", "{}"),
    ("paused_s", "paused s", "{:.3f}"),
    ("span_s", "span s", "{:.3f}"),
)

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; }
th { background: #f0f0f0; } td:first-child { text-align: left; }
tr.fail td { background: #fbe3e1; }
.ok { color: #1e8449; } .fail { color: #c0392b; }
img { max-width: 48%; margin: 4px; border: 1px solid #eee; }
"""


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    try:
        return html.escape(fmt.format(value))
    except (TypeError, ValueError):
        return html.escape(str(value))


def limits_text(limits: Sequence[Mapping[str, Any]] | None) -> str:
    """A bucket's extra limits with the violations of each: ``'100/min: 0, 1000/h: 1'``."""
    return ", ".join(f"{lim['limit']}: {lim['violations']}" for lim in limits or ())


def _table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    out = ["<table>", "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for _, h, _ in COLUMNS)]
    for row in rows:
        cls = "" if row.get("ok") else ' class="fail"'
        shown = {**row, "limits": limits_text(row.get("limits")) or None}
        cells = "".join(f"<td>{_cell(shown.get(k), fmt)}</td>" for k, _, fmt in COLUMNS)
        out.append(f"<tr{cls}>{cells}</tr>")
    out.append("</table>")
    return out


def write_report(path: Path, doc: Mapping[str, Any], images: Mapping[str, Sequence[str]]) -> None:
    """Write ``path``: the verdict, the table of ``doc["buckets"]``, then ``images`` (bucket ->
    PNG names relative to the report; key ``""`` for the plots across buckets)."""
    rows: Sequence[Mapping[str, Any]] = doc["buckets"]
    verdict = (
        '<p class="ok">every bucket kept its interval and limits, with no duplicate start</p>'
        if doc["ok"]
        else '<p class="fail">violations or duplicate starts found (rows in red)</p>'
    )
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8"><title>celery_interval audit</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>celery_interval audit</h1>",
        f"<p>{doc['entries']:,} ledger entries of {len(rows)} buckets from "
        f"{html.escape(', '.join(doc['ledgers']))}; generated {html.escape(doc['generated'])}."
        "</p>",
        verdict,
        *_table(rows),
    ]
    for name in images.get("", []):
        parts.append(f'<h2>Starts per worker</h2><img src="{html.escape(name)}" alt="workers">')
    for row in rows:
        names = images.get(row["bucket"])
        if not names:
            continue
        bucket = html.escape(row["bucket"])
        parts.append(f"<h2>{bucket}</h2>")
        if row.get("duplicate_tasks"):
            tasks = ", ".join(html.escape(t) for t in row["duplicate_tasks"])
            parts.append(f'<p class="fail">started more than once: {tasks}</p>')
        parts.extend(f'<img src="{html.escape(n)}" alt="{bucket}">' for n in names)
    parts.append("</body></html>")
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
