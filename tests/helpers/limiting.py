"""The bench's limiting HTTP server (a token bucket answering 429 with Retry-After), for tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def limiting_server() -> ModuleType:
    """``bench/limiting_server.py`` as a module (bench/ is scripts, not a package)."""
    loaded = sys.modules.get("limiting_server")
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location("limiting_server", BENCH / "limiting_server.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["limiting_server"] = module
    spec.loader.exec_module(module)
    return module
