"""The documentation builds without a warning, and cites only tests and files that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

#: The repository: the nearest folder above this file with a pyproject.toml (tests may move).
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
DOCS = ROOT / "docs"
TESTS = ROOT / "tests"

#: ``test_file.py::test_name`` as the docs cite a test (the file name alone: tests may move).
CITATION = re.compile(r"\b(test_\w+\.py)::(test_\w+)")
#: A repository path the docs name: ``bench/compare.py``, ``examples/tenants.py``, ``docs/x.md``.
REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:bench|examples|tools|docs|celery_interval|tests|\.ci)/[\w./-]*[\w/])"
)


def doc_files() -> list[Path]:
    """Every file the reader sees: the top-level Markdown files and the site's sources."""
    top = [ROOT / name for name in ("README.md", "BENCHMARKS.md", "CHANGELOG.md")]
    site = [
        path
        for path in DOCS.rglob("*")
        if path.suffix in {".md", ".rst"} and "_build" not in path.relative_to(DOCS).parts
    ]
    return [path for path in top + sorted(site) if path.exists()]


def citations(texts: dict[str, str]) -> set[tuple[str, str]]:
    return {match.groups() for text in texts.values() for match in CITATION.finditer(text)}


def missing_tests(cited: set[tuple[str, str]], tests_dir: Path) -> list[str]:
    """The cited ``file::test`` pairs with no ``def test`` in a file of that name under
    ``tests_dir`` (searched recursively)."""
    missing = []
    for file_name, test_name in sorted(cited):
        defined = re.compile(rf"^\s*(?:async\s+)?def {re.escape(test_name)}\(", re.MULTILINE)
        files = list(tests_dir.rglob(file_name))
        if not any(defined.search(path.read_text(encoding="utf-8")) for path in files):
            where = (
                "no such file"
                if not files
                else "no such test in "
                + ", ".join(str(path.relative_to(tests_dir)) for path in files)
            )
            missing.append(f"{file_name}::{test_name} ({where})")
    return missing


def sphinx_build(source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """``sphinx-build -W --keep-going`` of ``source`` into ``out`` (warnings are errors)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            "-d",
            str(out / "doctrees"),
            str(source),
            str(out / "html"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )


def test_the_docs_build_without_a_warning(tmp_path: Path) -> None:
    """The site builds with warnings as errors, and its settings reference lists every setting
    of ``celery_interval.config.table.SETTINGS`` (it is generated from them)."""
    from celery_interval.config.table import SETTINGS

    proc = sphinx_build(DOCS, tmp_path)
    problems = [line for line in proc.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert proc.returncode == 0 and not problems, proc.stdout + proc.stderr
    page = (tmp_path / "html" / "configuration.html").read_text(encoding="utf-8")
    absent = [setting.key for setting in SETTINGS if setting.key not in page]
    assert not absent, f"settings missing from the reference: {absent}"


def test_a_warning_fails_the_build(tmp_path: Path) -> None:
    """The build check itself: a page with a broken reference is a failed build."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "conf.py").write_text("project = 'probe'\n", encoding="utf-8")
    (source / "index.rst").write_text("Probe\n=====\n\nSee :doc:`nowhere`.\n", encoding="utf-8")
    proc = sphinx_build(source, tmp_path / "out")
    assert proc.returncode != 0
    assert "nowhere" in proc.stderr


def test_every_cited_test_exists() -> None:
    texts = {str(path): path.read_text(encoding="utf-8") for path in doc_files()}
    cited = citations(texts)
    assert len(cited) >= 50, f"only {len(cited)} test citations found: is the pattern right?"
    missing = missing_tests(cited, TESTS)
    assert not missing, "the docs cite tests that do not exist:\n" + "\n".join(missing)


def test_a_made_up_citation_is_caught(tmp_path: Path) -> None:
    """The citation check itself: a test that is not there, or a file that is not, is reported;
    a test found in a subfolder is not."""
    (tmp_path / "unit").mkdir()
    (tmp_path / "unit" / "test_a.py").write_text("def test_real() -> None:\n    pass\n")
    text = {
        "x.md": "`test_a.py::test_real`, `test_a.py::test_imagined`, `test_b.py::test_real`",
    }
    assert missing_tests(citations(text), tmp_path) == [
        "test_a.py::test_imagined (no such test in unit/test_a.py)",
        "test_b.py::test_real (no such file)",
    ]


def test_every_named_repository_path_exists() -> None:
    """No page points the reader at a file or folder the repository lacks."""
    missing = []
    for path in doc_files():
        for match in REPO_PATH.finditer(path.read_text(encoding="utf-8")):
            name = match.group(1)
            if "_build" in name or "*" in name:
                continue
            for candidate in (ROOT / name, path.parent / name):
                if candidate.exists():
                    break
            else:
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, "the docs name paths that do not exist:\n" + "\n".join(missing)
