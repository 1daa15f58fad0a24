"""An injected store clock for tests of the model and the stores."""

from __future__ import annotations


class Clock:
    """A clock that reads ``now_us`` and moves only when a test sets it."""

    def __init__(self, now_us: int) -> None:
        self.now_us = now_us

    def __call__(self) -> int:
        return self.now_us
