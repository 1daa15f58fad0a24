"""Throw-away venvs for installing the package as users do, and its wheel from the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ROOT",
    "Venv",
    "build_wheel",
    "clean_copy",
    "looks_offline",
    "make_venv",
    "minimal_env",
]

ROOT = Path(__file__).resolve().parents[2]

#: What stays out of a copy of the checkout: build outputs (a stale ``build/lib`` would put
#: deleted modules into the wheel), caches and VCS data.
_NOT_SOURCE = (
    ".git",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    ".tox",
    ".venv*",
    "_build",
    "out",
)

#: What pip prints when it cannot reach an index (urllib3's and the resolver's words).
_OFFLINE_MARKERS = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "NewConnectionError",
    "ConnectTimeoutError",
    "ProxyError",
)


@dataclass(frozen=True)
class Venv:
    """A venv's directory and the programs in its ``bin``."""

    path: Path

    @property
    def python(self) -> str:
        return str(self.bin("python"))

    def bin(self, name: str) -> Path:
        return self.path / "bin" / name

    def pip(self, *args: str, log: Path, cwd: Path = ROOT) -> int:
        """``python -m pip ARGS`` with its output appended to ``log``; the exit code."""
        return run_logged([self.python, "-m", "pip", *args], log, cwd)


def run_logged(cmd: list[str], log: Path, cwd: Path = ROOT) -> int:
    """Run ``cmd`` with stdout and stderr appended to ``log`` (after the command line)."""
    with log.open("ab") as out:
        out.write(("$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd).returncode


def make_venv(path: Path) -> Venv:
    """A fresh venv with pip at ``path`` (emptied first if it exists)."""
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return Venv(path)


def clean_copy(dest: Path, root: Path = ROOT) -> Path:
    """Copy the checkout's working tree to ``dest`` without build outputs and caches."""
    shutil.copytree(root, dest, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    return dest


def build_wheel(out_dir: Path, log: Path, root: Path = ROOT) -> Path:
    """Build the package's wheel from a clean copy of ``root`` into ``out_dir``; its path.

    The copy keeps the checkout free of the ``build/`` and ``*.egg-info`` a build leaves.
    """
    source = clean_copy(out_dir / "source", root)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out_dir), "."]
    if run_logged(cmd, log, cwd=source) != 0:
        raise RuntimeError(f"pip wheel failed: {log.read_text()[-2000:]}")
    shutil.rmtree(source, ignore_errors=True)
    wheels = sorted(out_dir.glob("celery_interval-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel in {out_dir}, found {wheels}")
    return wheels[0]


def looks_offline(pip_output: str) -> bool:
    """Whether a failed pip install failed because no index could be reached."""
    return any(marker in pip_output for marker in _OFFLINE_MARKERS)


def minimal_env(env: Venv, *extra_path: str) -> dict[str, str]:
    """An environment with the venv's ``bin`` (then ``extra_path``) as PATH and nothing of the
    caller's Python setup (no PYTHONPATH, no VIRTUAL_ENV of the test's own venv)."""
    kept = {k: os.environ[k] for k in ("HOME", "LANG", "LC_ALL", "TMPDIR") if k in os.environ}
    return {**kept, "PATH": os.pathsep.join([str(env.path / "bin"), *extra_path])}
