"""`celery -A proj interval …` through Celery's own command group, and a real demo run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

import pytest
from click.testing import CliRunner

from celery_interval.config.table import KEY_PREFIX
from celery_interval.schedule import Pace
from celery_interval.stores import keys
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.redis import RedisStore
from tests.helpers.cli import run  # noqa: F401  (the fixture)


def status(run: Any, queue: str) -> dict[str, Any]:  # noqa: F811
    result = run("status", queue, "--json", "--timeout", "0.2")
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json.loads(result.output)["queues"]
    assert [r["queue"] for r in rows] == [queue]
    return rows[0]


def test_status_with_no_worker_running(run: Any, redis_client: Any) -> None:  # noqa: F811
    redis_client.set(keys.born_key(KEY_PREFIX), 0)  # an old store: a new bucket's budgets full
    row = status(run, "api")
    assert (row["interval_s"], row["paused"], row["tickets"], row["exists"]) == (
        1.0,
        False,
        0,
        False,
    )
    assert (row["burst"], status(run, "mail")["burst"]) == (3, 1)
    assert row["limits"] == [
        {"limit": "100/min", "rate": "100/min", "interval_s": 0.6, "burst": 1, "budget_left": 1},
        {"limit": "1000/h burst 50", "rate": "1000/h", "interval_s": 3.6, "burst": 50,
         "budget_left": 50},
    ]  # fmt: skip
    assert (row["budget_left"], row["units_left"]) == (3, [3, 1, 50])
    assert status(run, "mail")["limits"] == []
    assert (row["interactive_share"], status(run, "mail")["interactive_share"]) == (0.2, None)
    assert row["declaration"] == {
        "interval": "1/s",
        "burst": 3,
        "limits": "100/min, 1000/h burst 50",
        "interactive_share": 0.2,
    }
    assert status(run, "mail")["declaration"] == {"interval": "30/min"}
    table = run("status", "--timeout", "0.2")
    assert table.exit_code == 0 and "api" in table.output and "mail" in table.output
    assert "burst 3" in table.output and "interactive share 0.2" in table.output
    assert "3/3," in table.output and "50/50" in table.output  # the budgets left (cells wrap)


def test_status_says_when_the_next_ticket_starts(run: Any, redis_client: Any) -> None:  # noqa: F811
    """api (burst 3, "100/min"): after one ticket its next one waits for "100/min" (0.6 s),
    not for the burst's budget to be full again (3 s); the budgets show what is left."""
    redis_client.set(keys.born_key(KEY_PREFIX), 0)
    from celery_interval.schedule import Pace
    from celery_interval.stores import TaskCopy

    run("status", "--timeout", "0.1")  # imports the CLI app with the environment set
    app = sys.modules["tests.helpers.cliapp"].app
    from celery_interval.app_store import store_of
    from celery_interval.config import settings_of

    settings = settings_of(app)
    pace = Pace(1_000_000, burst=3, limits=settings.limits_of("api"))
    granted = time.monotonic()
    store_of(app).grant(TaskCopy("api", "t1", 0), pace)
    row = status(run, "api")
    assert row["tickets"] == 1
    assert 0.6 - since(granted) < row["next_slot_in_s"] <= 0.6 + 0.05, row
    assert row["units_left"][:2] == [2, 0] and row["units_left"][2] in (49, 50)


def test_pause_unpause_and_set(run: Any) -> None:  # noqa: F811
    assert run("pause", "api").exit_code == 0
    assert status(run, "api")["paused"] is True
    assert status(run, "mail")["paused"] is False
    assert run("unpause", "api").exit_code == 0
    assert status(run, "api")["paused"] is False
    result = run("set", "api", "10/s")
    assert result.exit_code == 0 and "0.1s" in result.output
    row = status(run, "api")
    assert (row["interval_s"], row["overridden"]) == (0.1, True)


def test_set_says_the_interval_both_ways(run: Any) -> None:  # noqa: F811
    result = run("set", "api", "10/s")
    assert result.stdout == "api: interval 0.1s (one start every 0.1 s = 10/s)\n"
    assert result.stderr == ""
    bare = run("set", "api", "100")  # valid (100 s between starts), maybe meant as 100/s
    assert bare.exit_code == 0, bare.output
    assert bare.stdout == "api: interval 100s (one start every 100 s = 0.01/s)\n"
    assert bare.stderr == (
        "note: a bare number is seconds between starts; for 100 starts a second write 100/s\n"
    )
    assert status(run, "api")["interval_s"] == 100.0
    assert run("set", "api", "500ms").stdout.startswith("api: interval 0.5s ")


def test_unset_goes_back_to_the_configured_interval(run: Any, redis_client: Any) -> None:  # noqa: F811
    store = RedisStore(redis_client)
    for i in range(3):
        store.grant(TaskCopy("api", f"t{i}", 0), Pace(1_000_000))
    assert run("pause", "api").exit_code == 0
    assert run("set", "api", "3s").exit_code == 0
    before = status(run, "api")
    assert (before["interval_s"], before["overridden"], before["tickets"]) == (3.0, True, 3)
    result = run("unset", "api")
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "api: override dropped; interval 1s (one start every 1 s = 1/s), as configured\n"
    )
    after = status(run, "api")
    assert (after["interval_s"], after["overridden"]) == (1.0, False)
    kept = ("epoch", "tickets", "paused", "exists")
    assert {k: after[k] for k in kept} == {k: before[k] for k in kept}, "no new epoch"
    again = run("unset", "api")
    assert again.exit_code == 0, "unsetting a bucket with no override is no error"
    assert again.stdout == (
        "api: no interval override to drop; interval 1s (one start every 1 s = 1/s), "
        "as configured\n"
    )
    ops = [(f["op"], f.get("changed")) for _id, f in store.ledger("api")]
    assert ops[-2:] == [("unset_interval", "1"), ("unset_interval", "0")]
    assert [f["interval"] for _id, f in store.ledger("api")][-2:] == ["1000000", "1000000"]
    fresh = run("unset", "mail")  # no state at all: none is made
    assert fresh.exit_code == 0 and "no interval override to drop" in fresh.stdout
    assert store.read_state("mail") is None


STATUS_KEYS = {"queue", "exists", "epoch", "interval_s", "overridden", "adapted", "paused",
               "tickets", "next_slot_in_s", "units_left", "running", "outer",
               "outer_paused"}  # fmt: skip


def since(mark_s: float) -> float:
    """Seconds since the monotonic ``mark_s``: how far a bucket's next slot may have come
    nearer by the time a CLI call read it."""
    return time.monotonic() - mark_s


def json_of(result: Any) -> dict[str, Any]:
    """The one JSON object a ``--json`` command printed on stdout."""
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    obj: dict[str, Any] = json.loads(lines[0])
    return obj


def test_json_on_every_subcommand(run: Any, redis_client: Any, tmp_path: Any) -> None:  # noqa: F811
    paused = json_of(run("pause", "api", "--json"))
    assert set(paused) == STATUS_KEYS and (paused["queue"], paused["paused"]) == ("api", True)
    unpaused = json_of(run("unpause", "api", "--json"))
    assert set(unpaused) == STATUS_KEYS and unpaused["paused"] is False
    assert unpaused["epoch"] == paused["epoch"]
    set_ = run("set", "mail", "100", "--json")
    assert "note: a bare number" in set_.stderr, "the note stays off stdout"
    changed = json_of(set_)
    assert set(changed) == STATUS_KEYS and changed["queue"] == "mail"
    assert (changed["interval_s"], changed["overridden"]) == (100.0, True)
    unset = json_of(run("unset", "mail", "--json"))
    assert set(unset) == STATUS_KEYS | {"dropped"}
    assert (unset["interval_s"], unset["overridden"], unset["dropped"]) == (2.0, False, True)
    assert json_of(run("unset", "mail", "--json"))["dropped"] is False
    assert json_of(run("reset", "api", "--yes", "--json")) == {"queue": "api", "reset": True}
    asked = run("reset", "api", "--json", input="y\n")
    assert "reset api?" in asked.stderr, "the question goes to stderr"
    assert json_of(asked) == {"queue": "api", "reset": True}
    out = tmp_path / "ledger.jsonl"
    exported = json_of(run("ledger", "export", "--out", str(out), "--bucket", "mail", "--json"))
    assert exported == {"entries": 3, "per_bucket": {"mail": 3}, "out": str(out)}
    assert len(out.read_text().splitlines()) == 3
    to_stdout = run("ledger", "export", "--out", "-", "--json")
    assert to_stdout.exit_code == 2 and to_stdout.stdout == ""
    assert "--json needs --out FILE or DIR" in to_stdout.stderr


def test_control_replies_read_the_budgets_as_status_does(run: Any, redis_client: Any) -> None:  # noqa: F811
    """api (burst 3, "100/min", "1000/h burst 50"): after one ticket, pause --json says when
    the slot a ticket gets now comes ("100/min": 0.6 s) and each budget's units left, as
    status does (paused, the bucket's time stands still: the same figures); so do unpause, set
    and unset."""
    redis_client.set(keys.born_key(KEY_PREFIX), 0)  # an old store: a new bucket's budgets full
    run("status", "--timeout", "0.1")  # imports the CLI app with the environment set
    app = sys.modules["tests.helpers.cliapp"].app
    from celery_interval.app_store import store_of
    from celery_interval.control import configured_pace

    granted = time.monotonic()
    store_of(app).grant(TaskCopy("api", "t1", 0), configured_pace(app, "api"))
    paused = json_of(run("pause", "api", "--json"))
    assert paused["units_left"][:2] == [2, 0] and paused["units_left"][2] in (49, 50)
    assert 0.6 - since(granted) < paused["next_slot_in_s"] <= 0.6 + 0.05, paused
    row = status(run, "api")
    assert (paused["next_slot_in_s"], paused["units_left"]) == (
        row["next_slot_in_s"],
        row["units_left"],
    )
    for args in (("set", "api", "2s"), ("unset", "api"), ("unpause", "api")):
        assert len(json_of(run(*args, "--json"))["units_left"]) == 3, args


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("set", "api", "fast", "--json"), "interval='fast': not an interval; give seconds"),
        (("set", "api", "100/x", "--json"), "interval='100/x': not an interval"),
        (("set", "api", "2m", "--json"), "interval='2m': ambiguous; write '2min'"),
        (("pause", "nope", "--json"), "unknown interval bucket 'nope'"),
        (("unpause", "nope", "--json"), "unknown interval bucket 'nope'"),
        (("unset", "nope", "--json"), "unknown interval bucket 'nope'"),
        (("reset", "nope", "--yes", "--json"), "unknown interval bucket 'nope'"),
    ],
)
def test_json_errors_are_one_line_on_stderr(
    run: Any,  # noqa: F811
    redis_client: Any,
    args: tuple[str, ...],
    named: str,
) -> None:
    result = run(*args)
    assert result.exit_code == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and named in lines[0], result.stderr
    assert list(redis_client.scan_iter()) == [], "a refused command wrote to the store"


def test_reset_asks_unless_yes(run: Any) -> None:  # noqa: F811
    run("pause", "api")
    declined = run("reset", "api", input="n\n")
    assert declined.exit_code != 0 and status(run, "api")["paused"] is True
    assert run("reset", "api", "--yes").exit_code == 0
    assert status(run, "api")["paused"] is False


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("set", "api", "fast"), "'fast'"),
        (("set", "api", "10/fortnight"), "'10/fortnight'"),
        (("set", "api", "0"), "'0'"),
        (("set", "api", "nan"), "'nan'"),
        (("pause", "nope"), "'nope'"),
        (("unpause", "nope"), "'nope'"),
        (("unset", "nope"), "'nope'"),
        (("status", "nope"), "'nope'"),
        (("reset", "nope", "--yes"), "'nope'"),
    ],
)
def test_bad_input_names_the_value(run: Any, args: tuple[str, ...], named: str) -> None:  # noqa: F811
    result = run(*args)
    assert result.exit_code != 0
    assert named in result.output
    if "nope" in named:
        assert "api, mail" in result.output, "the error lists the configured queues"


def _no_network_prefix() -> list[str]:
    """`unshare -n` (an empty network namespace: nothing listens anywhere) when we may use it."""
    if shutil.which("unshare") and os.geteuid() == 0:
        probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
        if probe.returncode == 0:
            return ["unshare", "-n"]
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true but `unshare -n` is not available to check the embedded demo")
    return []


def test_demo_json_real_run() -> None:
    """The README's main command, as a newcomer runs it: embedded Redis, 3 real workers, and
    (where possible) inside an empty network namespace."""
    proc = subprocess.run(
        [
            *_no_network_prefix(),
            sys.executable,
            "-m",
            "celery_interval.cli",
            "demo",
            "--json",
            "--tasks",
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, "--json prints exactly one JSON object"
    figures = json.loads(lines[0])
    for key in ("tasks", "completed", "duplicates", "violations", "min_gap_s", "interval_s",
                "workers", "utilization", "p99_lateness_s"):  # fmt: skip
        assert key in figures
    assert (figures["tasks"], figures["completed"], figures["duplicates"]) == (30, 30, 0)
    assert figures["violations"] == 0 and figures["min_gap_s"] >= 0.05
    # Utilization is how soon a machine wakes the workers: printed, measured in bench/pool.py.
    assert figures["workers"] == 3 and 0 < figures["utilization"] <= 1.0
    print(f"FIGURES demo utilization {figures['utilization']:.3f}")


class _JavaError:
    """What py4j hands over of a JVM exception: toString, getCause, getSuppressed."""

    def __init__(self, text: str, cause: Any = None, suppressed: tuple[Any, ...] = ()) -> None:
        self.text, self.cause, self.suppressed = text, cause, suppressed

    def toString(self) -> str:
        return self.text

    def getCause(self) -> Any:
        return self.cause

    def getSuppressed(self) -> tuple[Any, ...]:
        return self.suppressed


def test_a_spark_error_names_what_failed_past_a_wrapper_of_several_failures() -> None:
    """Spark wraps concurrent stage failures in one error whose own line names nothing: the
    audit's message comes from its cause (here the file that failed to parse)."""
    from celery_interval.cli.tool import _spark_error

    read = "[FAILED_READ_FILE.NO_HINT] Encountered error while reading file file:///x/l.jsonl."
    wrapper = _JavaError(
        "org.apache.spark.SparkException: [STAGE_MATERIALIZATION_MULTIPLE_FAILURES] Multiple"
        " failures (3) in stage materialization:",
        cause=_JavaError(f"org.apache.spark.SparkException: {read}  SQLSTATE: KD001"),
        suppressed=(_JavaError("org.apache.spark.SparkException: [FAILED_READ_FILE] other"),),
    )
    exc = RuntimeError("An error occurred while calling o42.collect.")
    exc.java_exception = wrapper  # type: ignore[attr-defined]
    assert _spark_error(exc) == f"{read}  SQLSTATE: KD001"
    lone = RuntimeError("[ONLY_A_WRAPPER] nothing else")
    assert _spark_error(lone) == "[ONLY_A_WRAPPER] nothing else"


def test_the_command_line_and_the_package_tell_their_version() -> None:
    from importlib.metadata import version

    import celery_interval
    from celery_interval.cli import main

    installed = version("celery-interval")
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"celery-interval, version {installed}"
    assert celery_interval.__version__ == installed
