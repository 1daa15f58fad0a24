"""Install the package with each extra into a throw-away venv and import what it is for.

    python tools/check_extras.py              # every extra, and "base" (the install with none)
    python tools/check_extras.py spark docs   # only these
    python tools/check_extras.py --keep       # keep the venvs and logs under /tmp for a look

Each extra gets a fresh venv under a temporary folder, ``pip install '.[extra]'`` from this
checkout (what a user gets from the registry today, inside the pins of pyproject.toml), then one
``python -W error`` process that imports the modules the extra is for: a warning at import is
a failure, as is ``pip check`` finding a broken requirement. The extras run one after another
(each takes a minute or more); the last lines are one verdict per extra. Not part of the test
run: it downloads and installs everything from scratch.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.venvs import ROOT, make_venv, run_logged

#: What each extra is for, as Python run under ``-W error`` in its venv.
CHECKS: dict[str, str] = {
    "base": "import celery_interval, celery_interval.cli, celery_interval.ledger, "
    "celery_interval.worker.bootstep",
    "embedded": "from celery_interval.demo.embedded import find_redis_server; "
    "import os; assert os.access(find_redis_server(), os.X_OK)",
    # pyspark.pandas runs PySpark's own pandas/pyarrow/numpy version checks (and warns on a
    # pandas it does not support); the spark subpackage is what the audit and fan-out import.
    "spark": "import os; os.environ['PYARROW_IGNORE_TIMEZONE'] = '1'; "
    "import pyspark, pandas, pyarrow, matplotlib; import pyspark.pandas; "
    "from pyspark.sql.pandas.utils import require_minimum_pandas_version as p, "
    "require_minimum_pyarrow_version as a; p(); a(); "
    "import celery_interval.spark, celery_interval.spark.audit, celery_interval.spark.plots; "
    "from pyspark.sql.connect.utils import check_dependencies; check_dependencies()",
    "bench": "import dramatiq, dramatiq.brokers.redis, psutil, matplotlib.pyplot",
    "docs": "import sphinx, myst_parser, sphinx_click",
    "dev": "import pytest, pytest_timeout, hypothesis, mypy, tox, gevent, sphinx, myst_parser, "
    "sphinx_click, celery.contrib.testing.worker, celery_interval.testing",
    "celery-suite": "import pytest_rerunfailures, pydantic, pytest_timeout",
}


def check(extra: str, where: Path) -> tuple[bool, str]:
    """(ok, what happened) for one extra in a fresh venv under ``where``."""
    env_dir = where / f"venv-{extra}"
    log = where / f"{extra}.log"
    env = make_venv(env_dir)
    python = env.python
    target = "." if extra == "base" else f".[{extra}]"
    if env.pip("install", "-q", target, log=log) != 0:
        return False, f"pip install {target} failed (see {log})"
    if env.pip("check", log=log) != 0:
        return False, f"pip check found broken requirements (see {log})"
    if run_logged([python, "-W", "error", "-c", CHECKS[extra]], log) != 0:
        return False, f"import under -W error failed (see {log})"
    versions = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
    ).stdout.split()
    wanted = ("pyspark", "pandas", "pyarrow", "numpy", "celery", "kombu", "redis", "sphinx")
    shown = [v for v in versions if v.split("==")[0].lower() in wanted]
    return True, " ".join(shown)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extras", nargs="*", default=list(CHECKS), help="default: all")
    parser.add_argument("--keep", action="store_true", help="keep the venvs and logs")
    args = parser.parse_args(argv)
    unknown = [e for e in args.extras if e not in CHECKS]
    if unknown:
        parser.error(f"unknown extra(s) {unknown}; known: {', '.join(CHECKS)}")
    # pip builds a local project in place: leave no build/ or egg-info behind that was not there
    leftovers = [p for p in (ROOT / "build", ROOT / "celery_interval.egg-info") if not p.exists()]
    where = Path(tempfile.mkdtemp(prefix="check-extras-"))
    print(f"venvs and logs in {where}", flush=True)
    verdicts = []
    for extra in args.extras:
        began = time.monotonic()
        ok, note = check(extra, where)
        took = time.monotonic() - began
        line = f"{extra:13} {'OK  ' if ok else 'FAIL'} {took:5.0f}s  {note}"
        print(line, flush=True)
        verdicts.append((ok, line))
        if not args.keep:
            shutil.rmtree(where / f"venv-{extra}", ignore_errors=True)
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    if len(verdicts) > 1:
        print("summary:\n" + "\n".join(line for _, line in verdicts))
    if not args.keep and all(ok for ok, _ in verdicts):
        shutil.rmtree(where, ignore_errors=True)
    return 0 if all(ok for ok, _ in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
