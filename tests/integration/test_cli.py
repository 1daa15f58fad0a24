"""`celery -A proj interval …` through Celery's own command group, and a real demo run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
from click.testing import CliRunner


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, redis_server: Any, redis_client: Any) -> Any:
    monkeypatch.setenv("CLI_TEST_BROKER", redis_server.broker_url_for(4))
    monkeypatch.setenv("CLI_TEST_STORE", redis_server.url_for(0))
    sys.modules.pop("tests.helpers.cliapp", None)
    from celery.bin.celery import celery

    def invoke(*args: str, input: str | None = None) -> Any:
        sys.modules.pop("tests.helpers.cliapp", None)
        return CliRunner().invoke(
            celery, ["-A", "tests.helpers.cliapp:app", "interval", *args], input=input
        )

    return invoke


def status(run: Any, queue: str) -> dict[str, Any]:
    result = run("status", queue, "--json", "--timeout", "0.2")
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json.loads(result.output)["queues"]
    assert [r["queue"] for r in rows] == [queue]
    return rows[0]


def test_status_with_no_worker_running(run: Any) -> None:
    row = status(run, "api")
    assert (row["interval_s"], row["paused"], row["tickets"], row["exists"]) == (
        1.0,
        False,
        0,
        False,
    )
    table = run("status", "--timeout", "0.2")
    assert table.exit_code == 0 and "api" in table.output and "mail" in table.output


def test_pause_unpause_and_set(run: Any) -> None:
    assert run("pause", "api").exit_code == 0
    assert status(run, "api")["paused"] is True
    assert status(run, "mail")["paused"] is False
    assert run("unpause", "api").exit_code == 0
    assert status(run, "api")["paused"] is False
    result = run("set", "api", "10/s")
    assert result.exit_code == 0 and "0.1s" in result.output
    row = status(run, "api")
    assert (row["interval_s"], row["overridden"]) == (0.1, True)


def test_reset_asks_unless_yes(run: Any) -> None:
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
        (("status", "nope"), "'nope'"),
        (("reset", "nope", "--yes"), "'nope'"),
    ],
)
def test_bad_input_names_the_value(run: Any, args: tuple[str, ...], named: str) -> None:
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
    assert figures["workers"] == 3 and figures["utilization"] >= 0.9


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
