"""The Spark tests' shared fixture: the classic session still running is stopped at the end."""

from __future__ import annotations

from tests.helpers.spark_fixtures import _stop_classic_session

__all__ = ["_stop_classic_session"]
