"""FileStore: persistence, process and thread locking, corrupt files, crash-safe writes."""

from __future__ import annotations

import inspect
import itertools
import json
import multiprocessing
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_interval.errors import StoreError, StoreUnavailable
from celery_interval.schedule import (
    IDLE_GRACE_US,
    MAX_LEAD_US,
    ClaimTerms,
    Limit,
    Outcome,
    Pace,
    Slot,
)
from celery_interval.stores import file as file_module
from celery_interval.stores.base import Store, TaskCopy
from celery_interval.stores.file import FileStore
from celery_interval.stores.memory import MemoryStore
from tests.helpers.fakeclock import Clock

I_US = 1_000
T0_US = 1_700_000_000_000_000


@pytest.fixture
def clock() -> Clock:
    return Clock(T0_US)


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> FileStore:
    return FileStore(tmp_path, clock_us=clock)


def test_is_a_store(store: FileStore) -> None:
    """Every operation of the Store protocol, with the protocol's parameters."""
    operations = [n for n, v in vars(Store).items() if callable(v) and not n.startswith("_")]
    assert len(operations) > 10
    for name in operations:
        ours = getattr(store, name, None)
        assert callable(ours), f"FileStore has no {name}"
        wanted = list(inspect.signature(getattr(Store, name)).parameters)[1:]
        assert list(inspect.signature(ours).parameters) == wanted, name
    store.ping()
    store.close()


def test_state_and_marks_persist_across_instances(tmp_path: Path, clock: Clock) -> None:
    first = FileStore(tmp_path, clock_us=clock)
    g1 = first.grant(TaskCopy("api", "t1", 0), Pace(I_US))
    first.done([TaskCopy("api", "t1", 0)], dedupe_ttl_us=60 * I_US)
    first.pause("api", I_US)
    first.close()

    second = FileStore(tmp_path, clock_us=clock)
    assert second.grant(TaskCopy("api", "t1", 0), Pace(I_US)).outcome is Outcome.DUPLICATE
    g2 = second.grant(TaskCopy("api", "t2", 0), Pace(I_US))
    assert (g2.epoch, g2.ticket, g2.slot_us) == (g1.epoch, 2, g1.slot_us + I_US)
    status = second.status("api", I_US)
    assert status.exists and status.paused and status.ticket == 2


def test_lease_and_claim_semantics_match_memory_store(store: FileStore, clock: Clock) -> None:
    g = store.grant(TaskCopy("api", "t1", 0), Pace(I_US))
    clock.now_us += g.delay_us
    assert store.claim(
        TaskCopy("api", "t1", 0), I_US, g.slot, ClaimTerms("w1", 5 * I_US)
    ).outcome is (Outcome.OK)
    held = store.claim(TaskCopy("api", "t1", 0), I_US, g.slot, ClaimTerms("w2", 5 * I_US))
    assert (held.outcome, held.delay_us) == (Outcome.HELD, 5 * I_US)
    assert store.renew("api", "t1", 0, "w1", 10 * I_US)
    assert not store.renew("api", "t1", 0, "w2", 10 * I_US)
    store.done([TaskCopy("api", "t1", 0)], dedupe_ttl_us=I_US)
    again = store.claim(TaskCopy("api", "t1", 0), I_US, g.slot, ClaimTerms("w2", 5 * I_US))
    assert again.outcome is Outcome.DUPLICATE


def test_reset_forgets_state_but_keeps_dedupe(store: FileStore, clock: Clock) -> None:
    g = store.grant(TaskCopy("api", "t1", 0), Pace(I_US))
    store.done([TaskCopy("api", "t1", 0)], dedupe_ttl_us=60 * I_US)
    clock.now_us += 5
    store.reset("api")
    assert not store.status("api", I_US).exists
    assert store.grant(TaskCopy("api", "t1", 0), Pace(I_US)).outcome is Outcome.DUPLICATE
    assert store.grant(TaskCopy("api", "t2", 0), Pace(I_US)).epoch == g.epoch + 5  # a new epoch


def test_expired_marks_are_pruned_on_write(store: FileStore, clock: Clock) -> None:
    store.done([TaskCopy("api", f"t{i}", 0) for i in range(50)], dedupe_ttl_us=I_US)
    path = store.state_path("api")
    assert len(json.loads(path.read_bytes())["marks"]) == 50
    clock.now_us += I_US
    store.grant(TaskCopy("api", "other", 0), Pace(I_US))
    marks = json.loads(path.read_bytes())["marks"]
    assert [(m["task_id"], m["kind"]) for m in marks] == [("other", "granted")]


def test_read_only_and_no_op_operations_do_not_write(
    store: FileStore, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    status = store.status("unknown", I_US)
    assert not status.exists
    assert not store.state_path("unknown").exists()
    assert not store.renew("unknown", "t1", 0, "w1", I_US)
    assert not store.state_path("unknown").exists()

    g = store.grant(TaskCopy("api", "t1", 0), Pace(I_US))
    writes: list[Path] = []
    real_write = FileStore._write
    monkeypatch.setattr(FileStore, "_write", staticmethod(lambda p, d: writes.append(p)))
    wait = store.claim(TaskCopy("api", "t1", 0), I_US, g.slot, ClaimTerms("w1", I_US))
    assert wait.outcome is Outcome.WAIT
    store.status("api", I_US)
    assert writes == []
    monkeypatch.setattr(FileStore, "_write", staticmethod(real_write))


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{not json",
        b"\xff\xfe garbage",
        b"[]",
        b'{"version": 99, "bucket": "api", "state": null, "marks": []}',
        b'{"version": 1, "bucket": "web", "state": null, "marks": []}',
        b'{"version": 1, "bucket": "api", "state": {"epoch": 1}, "marks": []}',
        b'{"version": 1, "bucket": "api", "state": null, "marks": {}}',
        b'{"version": 1, "bucket": "api", "state": null, "marks": [{"task_id": "t"}]}',
        b'{"version": 1, "bucket": "api", "state": null,'
        b' "marks": [{"task_id": "t", "retries": 0, "kind": "odd", "expires_real_us": 9}]}',
    ],
    ids=repr,
)
def test_corrupt_state_file_raises_store_error_naming_it(store: FileStore, content: bytes) -> None:
    path = store.state_path("api")
    path.write_bytes(content)
    for operation in (
        lambda: store.grant(TaskCopy("api", "t1", 0), Pace(I_US)),
        lambda: store.status("api", I_US),
        lambda: store.pause("api", I_US),
        lambda: store.reset("api"),
    ):
        with pytest.raises(StoreError) as info:
            operation()
        assert not isinstance(info.value, StoreUnavailable)
        assert str(path) in str(info.value)
    assert path.read_bytes() == content  # never reset silently


def test_corrupt_state_with_wrong_field_types(store: FileStore) -> None:
    store.grant(TaskCopy("api", "t1", 0), Pace(I_US))
    path = store.state_path("api")
    doc = json.loads(path.read_bytes())
    doc["state"]["ticket"] = "7"
    path.write_text(json.dumps(doc))
    with pytest.raises(StoreError, match="ticket='7'"):
        store.grant(TaskCopy("api", "t2", 0), Pace(I_US))
    doc["state"]["ticket"] = True
    path.write_text(json.dumps(doc))
    with pytest.raises(StoreError, match="ticket=True"):
        store.grant(TaskCopy("api", "t2", 0), Pace(I_US))


def test_leftover_temp_file_from_a_crashed_writer_is_harmless(store: FileStore) -> None:
    store.grant(TaskCopy("api", "t1", 0), Pace(I_US))
    path = store.state_path("api")
    before = path.read_bytes()
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(before[: len(before) // 2])  # a half-written temp file, as a crash leaves it
    assert store.status("api", I_US).ticket == 1
    assert store.grant(TaskCopy("api", "t2", 0), Pace(I_US)).ticket == 2
    assert not tmp.exists()
    assert json.loads(path.read_bytes())["state"]["ticket"] == 2


def test_failed_replace_leaves_the_old_state(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.grant(TaskCopy("api", "t1", 0), Pace(I_US))
    path = store.state_path("api")
    before = path.read_bytes()

    def crash(src: Any, dst: Any) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StoreUnavailable, match="cannot write state file"):
        store.grant(TaskCopy("api", "t2", 0), Pace(I_US))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert store.grant(TaskCopy("api", "t2", 0), Pace(I_US)).ticket == 2


def test_unusable_directory_is_store_unavailable(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "missing")
    with pytest.raises(StoreUnavailable):
        store.ping()
    with pytest.raises(StoreUnavailable, match="missing"):
        store.grant(TaskCopy("api", "t1", 0), Pace(I_US))


def test_wall_clock_by_default(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    before_us = file_module.wall_clock_us()
    g = store.grant(TaskCopy("api", "t1", 0), Pace(I_US))
    assert before_us <= g.epoch <= file_module.wall_clock_us()
    assert "wall clock" in (FileStore.__doc__ or "")


@pytest.mark.parametrize(
    "buckets",
    [
        ["api", "API", "Api"],
        ["a/b", "a%2Fb", "a_b", "a.b"],
        ["..", ".", "", "-"],
        ["é", "%C3%A9", "e"],
        ["x" * 300, "x" * 301, "x" * 159, "x" * 160],
    ],
)
def test_bucket_names_map_to_distinct_safe_files(tmp_path: Path, buckets: list[str]) -> None:
    store = FileStore(tmp_path)
    for i, bucket in enumerate(buckets):
        for _ in range(i + 1):
            store.grant(TaskCopy(bucket, f"t{_}", 0), Pace(I_US))
    names = {store.state_path(b).name for b in buckets}
    assert len(names) == len(buckets)
    assert len({n.lower() for n in names}) == len(buckets)  # case-insensitive filesystems too
    for i, bucket in enumerate(buckets):
        path = store.state_path(bucket)
        assert path.parent == tmp_path and len(path.name) < 200
        assert store.status(bucket, I_US).ticket == i + 1


# -- concurrency ------------------------------------------------------------------------------


def _grant_many(directory: str, worker: int, count: int) -> list[tuple[int, int, int]]:
    store = FileStore(directory)
    results = []
    for i in range(count):
        g = store.grant(TaskCopy("api", f"w{worker}-t{i}", 0), Pace(I_US))
        results.append((g.epoch, g.ticket, g.slot_us))
    return results


def test_concurrent_processes_never_repeat_a_ticket(tmp_path: Path) -> None:
    n_processes, count = 4, 60
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(n_processes) as pool:
        per_process = pool.starmap(
            _grant_many, [(str(tmp_path), w, count) for w in range(n_processes)]
        )
    grants = sorted(g for results in per_process for g in results)
    assert len({epoch for epoch, _, _ in grants}) == 1
    assert [ticket for _, ticket, _ in grants] == list(range(1, n_processes * count + 1))
    slots = [slot for _, _, slot in grants]
    assert all(b - a >= I_US for a, b in itertools.pairwise(slots))
    assert FileStore(tmp_path).status("api", I_US).ticket == n_processes * count


def test_concurrent_threads_never_repeat_a_ticket(tmp_path: Path) -> None:
    n_threads, count = 8, 40
    results: list[list[tuple[int, int, int]]] = [[] for _ in range(n_threads)]

    def run(worker: int) -> None:
        results[worker] = _grant_many(str(tmp_path), worker, count)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tickets = sorted(ticket for r in results for _, ticket, _ in r)
    assert tickets == list(range(1, n_threads * count + 1))


# -- the same answers as the model's reference store ------------------------------------------

BUCKETS = ["api", "mail"]
TASKS = ["t1", "t2", "t3"]
HOLDERS = ["w1", "w2"]

ops = st.one_of(
    st.tuples(st.just("advance"), st.integers(0, 2_500)),
    st.tuples(st.just("advance"), st.integers(IDLE_GRACE_US, IDLE_GRACE_US + 5_000)),
    st.tuples(st.just("grant"), st.sampled_from(BUCKETS), st.sampled_from(TASKS),
              st.integers(0, 1), st.sampled_from([0, 1_500])),
    st.tuples(st.just("claim"), st.sampled_from(BUCKETS), st.sampled_from(TASKS),
              st.integers(0, 1), st.sampled_from(HOLDERS), st.sampled_from([0, 20])),
    st.tuples(st.just("done"), st.sampled_from(BUCKETS), st.sampled_from(TASKS),
              st.integers(0, 1)),
    st.tuples(st.just("renew"), st.sampled_from(BUCKETS), st.sampled_from(TASKS),
              st.integers(0, 1), st.sampled_from(HOLDERS)),
    st.tuples(st.just("pause"), st.sampled_from(BUCKETS)),
    st.tuples(st.just("unpause"), st.sampled_from(BUCKETS)),
    st.tuples(st.just("set_interval"), st.sampled_from(BUCKETS), st.sampled_from([300, 2_000])),
    st.tuples(st.just("unset_interval"), st.sampled_from(BUCKETS)),
    st.tuples(st.just("reset"), st.sampled_from(BUCKETS)),
    st.tuples(st.just("status"), st.sampled_from(BUCKETS)),
)  # fmt: skip


def _apply(store: Store, op: tuple[Any, ...], granted: dict[Any, tuple[int, int]]) -> Any:
    name, *args = op
    if name == "grant":
        bucket, task, retries, not_before_in_us = args
        g = store.grant(TaskCopy(bucket, task, retries), Pace(I_US, not_before_in_us))
        granted.setdefault((bucket, task, retries), (g.epoch, g.slot_us))
        return g
    if name == "claim":
        bucket, task, retries, holder, lead_us = args
        epoch, slot_us = granted.get((bucket, task, retries), (0, 0))
        return store.claim(
            TaskCopy(bucket, task, retries),
            I_US,
            Slot(epoch, slot_us),
            ClaimTerms(holder, 3_000, lead_us),
        )
    if name == "done":
        return store.done([TaskCopy(args[0], args[1], args[2])], dedupe_ttl_us=4_000)
    if name == "renew":
        return store.renew(args[0], args[1], args[2], args[3], 3_000)
    if name == "set_interval":
        return store.set_interval(args[0], I_US, args[1])
    if name == "reset":
        return store.reset(args[0])
    return getattr(store, name)(args[0], I_US)


@settings(max_examples=60, deadline=None)
@given(st.lists(ops, max_size=40))
def test_same_answers_as_memory_store(steps: list[tuple[Any, ...]]) -> None:
    clock = Clock(T0_US)
    memory = MemoryStore(clock_us=clock)
    with tempfile.TemporaryDirectory() as directory:
        files = FileStore(directory, clock_us=clock)
        reopened = FileStore(directory, clock_us=clock)  # a second host on the same directory
        granted_m: dict[Any, tuple[int, int]] = {}
        granted_f: dict[Any, tuple[int, int]] = {}
        for i, step in enumerate(steps):
            if step[0] == "advance":
                clock.now_us += step[1]
                continue
            on = files if i % 2 else reopened
            assert _apply(on, step, granted_f) == _apply(memory, step, granted_m), step


# -- the birth marker and idle expiry --------------------------------------------------------


def test_birth_marker_idle_expiry_and_reset(store: FileStore, clock: Clock) -> None:
    assert not store.born_path().exists()
    assert store.status("api", I_US).next_slot_in_us == MAX_LEAD_US + I_US
    assert not store.born_path().exists(), "a status writes no marker"
    assert store.grant(TaskCopy("api", "t1", 0), Pace(I_US)).delay_us == MAX_LEAD_US + I_US
    assert store.born_path().read_text() == f"{T0_US}\n"
    clock.now_us += 10**9
    g = store.grant(TaskCopy("mail", "t1", 0), Pace(I_US))
    assert g.delay_us == 0, "a new bucket under an old marker starts at once"
    doc = json.loads(store.state_path("mail").read_bytes())
    assert doc["expires_real_us"] == clock.now_us + I_US + IDLE_GRACE_US
    clock.now_us += I_US + IDLE_GRACE_US
    assert not store.status("mail", I_US).exists, "an idle state expires"
    assert store.grant(TaskCopy("mail", "t2", 0), Pace(I_US)).ticket == 1
    store.pause("mail", I_US)
    assert "expires_real_us" not in json.loads(store.state_path("mail").read_bytes())
    store.reset("mail")
    assert json.loads(store.state_path("mail").read_bytes())["reset_us"] == clock.now_us
    clock.now_us += 5
    assert store.grant(TaskCopy("mail", "t3", 0), Pace(I_US)).delay_us == MAX_LEAD_US + I_US - 5
    assert "reset_us" not in json.loads(store.state_path("mail").read_bytes())


def test_a_corrupt_birth_marker_raises_store_error(store: FileStore) -> None:
    store.born_path().write_text("soon")
    with pytest.raises(StoreError, match="birth marker"):
        store.grant(TaskCopy("api", "t1", 0), Pace(I_US))


def test_a_state_written_before_bursts_reads_with_their_defaults(
    store: FileStore, clock: Clock
) -> None:
    """A state file without start_extra_us, last_slot_us and lost_start_us (an older version)
    decodes, and the bucket runs on as a burst-less one."""
    store.grant(TaskCopy("b", "t1", 0), Pace(1_000))
    path = store.state_path("b")
    doc = json.loads(path.read_bytes())
    for name in ("start_extra_us", "last_slot_us", "lost_start_us"):
        del doc["state"][name]
    path.write_text(json.dumps(doc))
    assert store.grant(TaskCopy("b", "t2", 0), Pace(1_000)).ticket == 2


def test_extra_limits_times_persist_and_an_older_file_reads_without_them(
    store: FileStore, clock: Clock
) -> None:
    """The extra limits' times are written (``limit_tats``) and read back; a file without them
    (an older version) reads as a bucket whose limits have counted nothing yet."""
    limits = (Limit(5_000), Limit(9_000, 2))
    first = store.grant(TaskCopy("b", "t1", 0), Pace(1_000, limits=limits))
    path = store.state_path("b")
    doc = json.loads(path.read_bytes())
    assert doc["state"]["limit_tats"] == f"{first.slot_us + 5_000}:,{first.slot_us + 18_000}:"
    second = FileStore(store.directory, clock_us=clock).grant(
        TaskCopy("b", "t2", 0), Pace(1_000, limits=limits)
    )
    assert second.slot_us - first.slot_us == 9_000  # the burst of 2 counted as used
    doc = json.loads(path.read_bytes())
    del doc["state"]["limit_tats"]
    path.write_text(json.dumps(doc))
    third = store.grant(TaskCopy("b", "t3", 0), Pace(1_000, limits=limits))
    assert third.slot_us - second.slot_us == 1_000  # the limits counted nothing yet
    doc["state"]["limit_tats"] = "1:2,x"
    path.write_text(json.dumps(doc))
    with pytest.raises(StoreError, match="limit_tats='1:2,x'"):
        store.grant(TaskCopy("b", "t4", 0), Pace(1_000, limits=limits))
