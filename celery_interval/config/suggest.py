"""The closest valid name to a mistyped one, said as ``; did you mean 'x'?``."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest", "did_you_mean"]


def closest(word: str, valid: Iterable[str]) -> str | None:
    """The name in ``valid`` closest to ``word``; None: none is close."""
    found = difflib.get_close_matches(word, sorted(set(valid)), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, valid: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the name in ``valid`` closest to ``word``; '' for none."""
    name = closest(word, valid)
    return "" if name is None else f"; did you mean {name!r}?"
