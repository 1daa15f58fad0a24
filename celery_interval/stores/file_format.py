"""The FileStore's state file format: a bucket's record as JSON, and read back validated."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery_interval.errors import StoreError
from celery_interval.schedule import (
    BucketState,
    Done,
    Granted,
    Lease,
    Mark,
    Place,
    Places,
    live_places,
)
from celery_interval.stores.tats import decode_tats, encode_tats

__all__ = ["FORMAT_VERSION", "Record", "decode_record", "encode_record"]

FORMAT_VERSION = 1
#: The integer fields; ``limit_tats`` is written as lib.lua's field ``x`` (absent: none).
_STATE_FIELDS = tuple(f.name for f in dataclasses.fields(BucketState) if f.name != "limit_tats")
_NULLABLE_FIELDS = frozenset(
    f.name for f in dataclasses.fields(BucketState) if "None" in str(f.type)
)
#: Fields a file written before they existed lacks: they read as their defaults.
_OPTIONAL_FIELDS = frozenset(
    f.name for f in dataclasses.fields(BucketState) if f.default is not dataclasses.MISSING
)

#: A bucket's record: state, marks, when the state expires, when the bucket was reset, places.
Record = tuple[BucketState | None, dict[tuple[str, int], Mark], int | None, int | None, Places]


def encode_record(bucket: str, record: Record, now_us: int) -> bytes:
    """The file's JSON; expired marks are dropped here, so files stay small."""
    state, marks, expires_real_us, reset_us, places = record
    rows: list[dict[str, Any]] = []
    for (task_id, retries), mark in sorted(marks.items()):
        if mark.expires_real_us <= now_us:
            continue
        row: dict[str, Any] = {"task_id": task_id, "retries": retries}
        if isinstance(mark, Lease):
            row.update(
                kind="lease",
                holder=mark.holder,
                start_us=mark.start_us,
                expires_real_us=mark.expires_real_us,
                epoch=mark.epoch,
                tat_us=mark.tat_us,
                admitted=mark.admitted,
                outer_tat_us=mark.outer_tat_us,
            )
        elif isinstance(mark, Granted):
            row.update(
                kind="granted",
                epoch=mark.epoch,
                ticket=mark.ticket,
                slot_us=mark.slot_us,
                expires_real_us=mark.expires_real_us,
            )
            if mark.front:
                row["front"] = True
        else:
            row.update(kind="done", expires_real_us=mark.expires_real_us)
        rows.append(row)
    fields: dict[str, Any] | None = None
    if state is not None:
        fields = {name: getattr(state, name) for name in _STATE_FIELDS}
        if state.limit_tats:
            fields["limit_tats"] = encode_tats(state.limit_tats)
    doc = {"version": FORMAT_VERSION, "bucket": bucket, "state": fields, "marks": rows}
    if expires_real_us is not None:
        doc["expires_real_us"] = expires_real_us
    if reset_us is not None:
        doc["reset_us"] = reset_us
    if live_places(places, now_us):
        doc["places"] = [[p.expires_real_us, p.holder] for p in live_places(places, now_us)]
    return (json.dumps(doc, separators=(",", ":"), sort_keys=True) + "\n").encode()


def decode_record(raw: bytes, path: Path, bucket: str) -> Record:
    """Parse and validate a state file; anything unexpected raises StoreError naming the file."""
    check = _Check(path)
    doc = _decode_document(raw, bucket, check)
    state = _decode_state(doc.get("state"), check)
    marks = _decode_marks(doc.get("marks"), check)
    expires_real_us, reset_us = (
        check.optional_integer(doc, name) for name in ("expires_real_us", "reset_us")
    )
    places = _decode_places(doc.get("places", []), check)
    return state, marks, expires_real_us, reset_us, places


@dataclass(frozen=True)
class _Check:
    """The checks of one state file's values, each failing with a StoreError naming the file."""

    path: Path

    def corrupt(self, why: str) -> StoreError:
        """The error for a file that is not as written (it is never reset silently)."""
        return StoreError(
            f"corrupt interval state file {str(self.path)!r}: {why} "
            "(inspect it; delete it to start the bucket over)"
        )

    def integer(self, obj: dict[str, Any], name: str, nullable: bool = False) -> Any:
        """``obj[name]``, an integer (or, if ``nullable``, a null that is there)."""
        value = obj.get(name)
        if value is None and nullable and name in obj:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.corrupt(f"{name}={value!r} is not an integer")
        return value

    def optional_integer(self, obj: dict[str, Any], name: str) -> int | None:
        """``obj[name]``, an integer or null (absent: null)."""
        return self.integer(obj, name, True) if name in obj else None


def _decode_document(raw: bytes, bucket: str, check: _Check) -> dict[str, Any]:
    """The file's JSON object, once its format version and bucket are the expected ones."""
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise check.corrupt(f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise check.corrupt("not a JSON object")
    if doc.get("version") != FORMAT_VERSION:
        raise check.corrupt(f"unknown format version {doc.get('version')!r}")
    if doc.get("bucket") != bucket:
        raise check.corrupt(f"holds bucket {doc.get('bucket')!r}, expected {bucket!r}")
    return doc


def _decode_state(raw_state: Any, check: _Check) -> BucketState | None:
    """The bucket's state from the file's ``state`` (null: none)."""
    if raw_state is None:
        return None
    if not isinstance(raw_state, dict):
        raise check.corrupt("state is not an object")
    try:
        limit_tats = decode_tats(raw_state.get("limit_tats", ""))
    except (AttributeError, ValueError) as exc:
        raise check.corrupt(f"limit_tats={raw_state.get('limit_tats')!r}: {exc}") from None
    return BucketState(
        **{
            name: check.integer(raw_state, name, name in _NULLABLE_FIELDS)
            for name in _STATE_FIELDS
            if name in raw_state or name not in _OPTIONAL_FIELDS
        },
        limit_tats=limit_tats,
    )


def _decode_marks(raw_marks: Any, check: _Check) -> dict[tuple[str, int], Mark]:
    """The marks by (task_id, retries) from the file's ``marks``."""
    if not isinstance(raw_marks, list):
        raise check.corrupt("marks is not a list")
    marks: dict[tuple[str, int], Mark] = {}
    for row in raw_marks:
        if not isinstance(row, dict) or not isinstance(row.get("task_id"), str):
            raise check.corrupt(f"bad mark {row!r}")
        key = (row["task_id"], check.integer(row, "retries"))
        marks[key] = _decode_mark(row, check)
    return marks


def _decode_mark(row: dict[str, Any], check: _Check) -> Mark:
    """One row of ``marks``, by its ``kind``: a lease, a done-mark or a grant."""
    kind = row.get("kind")
    if kind == "lease":
        holder = row.get("holder")
        if not isinstance(holder, str):
            raise check.corrupt(f"bad lease holder {holder!r}")
        return Lease(
            holder,
            check.integer(row, "start_us"),
            check.integer(row, "expires_real_us"),
            *(
                check.optional_integer(row, name)
                for name in ("epoch", "tat_us", "admitted", "outer_tat_us")
            ),
        )
    if kind == "done":
        return Done(check.integer(row, "expires_real_us"))
    if kind == "granted":
        names = ("epoch", "ticket", "slot_us", "expires_real_us")
        epoch, ticket, slot_us, until_us = (check.integer(row, name) for name in names)
        return Granted(epoch, ticket, slot_us, until_us, row.get("front") is True)
    raise check.corrupt(f"unknown mark kind {kind!r}")


def _decode_places(raw_places: Any, check: _Check) -> Places:
    """The concurrency cap's places from the file's ``places``: [expires_real_us, holder]."""
    if not isinstance(raw_places, list) or not all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[1], str) for p in raw_places
    ):
        raise check.corrupt(f"bad places {raw_places!r}")
    return tuple(Place(check.integer({"place": p[0]}, "place"), p[1]) for p in raw_places)
