"""FileStore: bucket state in fcntl-locked JSON files on a filesystem the workers share."""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from celery_interval.config.table import KEY_PREFIX
from celery_interval.errors import StoreError, StoreUnavailable
from celery_interval.schedule import Mark
from celery_interval.stores._apply import BucketTxn, ModelStore
from celery_interval.stores.file_format import FORMAT_VERSION, Record, decode_record, encode_record

__all__ = ["FORMAT_VERSION", "FileStore", "wall_clock_us"]

_SAFE_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789._-"
_MAX_STEM_CHARS = 160  # leaves room for ".json.tmp" under the usual 255-byte name limit


# POSIX locks belong to the process: threads of one process do not exclude each other with
# them, and closing any descriptor of a file drops all of the process's locks on it. So each
# lock file also gets one in-process lock, shared by every FileStore of this process.
_process_locks: dict[str, threading.Lock] = {}
_process_locks_guard = threading.Lock()


def _process_lock(lock_path: Path) -> threading.Lock:
    key = os.path.abspath(lock_path)
    with _process_locks_guard:
        lock = _process_locks.get(key)
        if lock is None:
            lock = _process_locks[key] = threading.Lock()
        return lock


def _forget_process_locks() -> None:
    """A forked child starts with no lock held (a parent thread may have held one at fork)."""
    global _process_locks_guard
    _process_locks.clear()
    _process_locks_guard = threading.Lock()


os.register_at_fork(after_in_child=_forget_process_locks)


def wall_clock_us() -> int:
    """This host's wall clock in integer microseconds since the Unix epoch."""
    return time.time_ns() // 1000


def file_stem(key_prefix: str, bucket: str) -> str:
    """A filename stem for a bucket: injective, case-insensitive-safe, never a dot name."""
    encoded = "".join(
        chr(byte) if chr(byte) in _SAFE_CHARS else f"%{byte:02X}"
        for byte in (key_prefix + bucket).encode("utf-8", "surrogatepass")
    )
    if len(encoded) <= _MAX_STEM_CHARS:
        return "b-" + encoded
    digest = hashlib.sha256((key_prefix + bucket).encode("utf-8", "surrogatepass")).hexdigest()
    # "~" never appears in an encoded name, so a hashed stem cannot equal a plain one.
    return f"b-{encoded[:80]}~{digest}"


def _marker_us(raw: bytes, path: Path, what: str) -> int:
    """A store-wide file's µs (``what``: the birth marker, the settle window's end), or a
    StoreError that says what deleting it costs."""
    try:
        return int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        cost = "buckets made next wait one interval" if what == "birth marker" else "nothing"
        raise StoreError(
            f"corrupt interval store {what} {str(path)!r}: {raw!r} (delete it: {cost})"
        ) from None


class _FileTxn:
    """One bucket's record loaded from its state file under the bucket's lock."""

    def __init__(self, now_us: int, record: Record, store: FileStore, write: bool) -> None:
        self.now_us = now_us
        self.state, self.marks, self.expires_real_us, self.reset_us, self.places = record
        if self.expires_real_us is not None and self.expires_real_us <= now_us:
            self.state = self.expires_real_us = None
        self._store = store
        self._write = write

    def _store_born_us(self, now_us: int) -> int:
        return self._store._store_born_us(now_us, self._write)

    def settle_until_us(self) -> int | None:
        path = self._store.settle_path()
        raw = self._store._read(path)
        return None if raw is None else _marker_us(raw, path, "settle window end")

    def set_settle_until_us(self, until_us: int) -> None:
        path = self._store.settle_path()
        tmp_path = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp_path.write_bytes(b"%d\n" % until_us)
            os.replace(tmp_path, path)  # every bucket's lock holder may write it
        except OSError as exc:
            raise StoreUnavailable(f"cannot write {str(path)!r}: {exc}") from exc

    def store_born_us(self) -> int:
        return self._store_born_us(self.now_us)

    def places_born_us(self) -> int | None:
        return self._store_born_us(self.now_us)

    def mark(self, task_id: str, retries: int) -> Mark | None:
        return self.marks.get((task_id, retries))

    def set_mark(self, task_id: str, retries: int, mark: Mark | None) -> None:
        if mark is None:
            self.marks.pop((task_id, retries), None)
        else:
            self.marks[(task_id, retries)] = mark


class FileStore(ModelStore):
    """The Store protocol on a shared directory, for clusters with a shared filesystem and no Redis.

    One JSON state file per bucket holds its ``BucketState`` and its live marks (leases and
    done-marks of ``(task_id, retries)``); every operation holds a POSIX ``fcntl.lockf`` lock on
    the bucket's lock file (these work over NFS with a lock manager) for its read-modify-write,
    and writes crash-safely (temp file in the same directory, fsync, ``os.replace``). Expired
    marks are dropped on every write, and so is a state past its ``schedule.expires_in_us``;
    nothing sweeps the directory, so an idle bucket's file stays (on disk, it costs no memory).
    The birth marker is a file of the directory, written once when a state is first made.

    Its clock is each host's **wall clock** (``time.time_ns() // 1000``), not one store clock as
    with Redis: the hosts sharing a directory must be NTP-synced, since the interval is only as
    exact as their clocks agree. Redis is the recommended store. ``clock_us`` replaces the clock
    in tests. A corrupt state file raises ``StoreError`` naming it (it is never reset silently);
    an unreachable directory or file raises ``StoreUnavailable``.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        key_prefix: str = KEY_PREFIX,
        clock_us: Callable[[], int] = wall_clock_us,
    ) -> None:
        self.directory = Path(directory)
        self._key_prefix = key_prefix
        self._clock_us = clock_us

    def __repr__(self) -> str:
        return f"FileStore({str(self.directory)!r})"

    def born_path(self) -> Path:
        """The file holding the store's birth marker (µs), written when first found missing."""
        return self.directory / ("born-" + file_stem(self._key_prefix, "")[2:])

    def settle_path(self) -> Path:
        """The file holding the end (µs) of the done marks' settle window after the store
        lost its state (``schedule.places.marks_settle_until_us``)."""
        return self.directory / ("settle-" + file_stem(self._key_prefix, "")[2:])

    def state_path(self, bucket: str) -> Path:
        """The JSON file holding ``bucket``'s state and marks."""
        return self.directory / (file_stem(self._key_prefix, bucket) + ".json")

    def born_us(self) -> int | None:
        path = self.born_path()
        raw = self._read(path)
        return None if raw is None else _marker_us(raw, path, "birth marker")

    def ping(self) -> None:
        """Raise ``StoreUnavailable`` unless the directory is a writable directory."""
        if not self.directory.is_dir() or not os.access(self.directory, os.W_OK | os.X_OK):
            raise StoreUnavailable(f"interval store directory {str(self.directory)!r} is unusable")

    def close(self) -> None:
        """Nothing to release: every operation opens and closes its own files."""
        return None

    @contextmanager
    def _locked(self, bucket: str, *, write: bool = True) -> Iterator[BucketTxn]:
        path = self.state_path(bucket)
        lock_path = path.with_name(path.name[: -len(".json")] + ".lock")
        with _process_lock(lock_path):
            try:
                lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as exc:
                raise StoreUnavailable(f"cannot open lock file {str(lock_path)!r}: {exc}") from exc
            try:
                try:
                    fcntl.lockf(lock_fd, fcntl.LOCK_EX)
                except OSError as exc:
                    raise StoreUnavailable(f"cannot lock {str(lock_path)!r}: {exc}") from exc
                raw = self._read(path)
                now_us = self._clock_us()
                record = (
                    decode_record(raw, path, bucket)
                    if raw is not None
                    else (None, {}, None, None, ())
                )
                txn = _FileTxn(now_us, record, self, write)
                yield txn
                if write:
                    kept = (txn.state, txn.marks, txn.expires_real_us, txn.reset_us, txn.places)
                    new = encode_record(bucket, kept, now_us)
                    empty = kept[:2] == (None, {}) and kept[3:] == (None, ())
                    if new != raw and not (raw is None and empty):
                        self._write(path, new)
            finally:
                os.close(lock_fd)  # closing the descriptor releases the lock

    def _store_born_us(self, now_us: int, write: bool) -> int:
        path = self.born_path()
        raw = self._read(path)
        if raw is None:
            if not write:
                return now_us
            tmp_path = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            try:
                tmp_path.write_bytes(b"%d\n" % now_us)
                os.link(tmp_path, path)  # fails if another process wrote it first
                return now_us
            except FileExistsError:
                raw = self._read(path)
            except OSError as exc:
                raise StoreUnavailable(f"cannot write {str(path)!r}: {exc}") from exc
            finally:
                tmp_path.unlink(missing_ok=True)
        return _marker_us(raw or b"", path, "birth marker")

    @staticmethod
    def _read(path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreUnavailable(f"cannot read state file {str(path)!r}: {exc}") from exc

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        # Only the lock holder writes, so one fixed temp name suffices: a crashed writer's
        # leftover is truncated by the next write and never read as state.
        tmp_path = path.with_name(path.name + ".tmp")
        try:
            fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp_path, path)
        except OSError as exc:
            raise StoreUnavailable(f"cannot write state file {str(path)!r}: {exc}") from exc
        _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable where the filesystem supports it (NFS may not)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
