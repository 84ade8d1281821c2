"""Settings for the test run: the product's settings, with each pytest-xdist worker isolated.

``make test`` runs the suite with ``pytest -n 2``. Both xdist workers would otherwise share one
Celery broker (the filesystem broker under ``var/``, or one Redis database), one Redis for the
breaker state and the channel layer, and one ``var/`` folder (tool ledger, worktrees). The
end-to-end tests start real ``celery worker`` processes that consume the ``loops`` queue: a
worker started by a test on ``gw1`` would take the nudges a test on ``gw0`` published (D6 saw
its own messages go missing that way). So each xdist worker gets, before the product settings
are read:

- its own ``LOOPWRIGHT_VAR_DIR`` (``<var dir>/<worker id>``): filesystem broker, SQLite files,
  ledgers and worktrees;
- its own Redis database for ``CELERY_BROKER_URL`` and ``REDIS_URL`` (the base database number
  plus the worker's index).

Worker processes a test starts inherit this environment (and this settings module), and the
marker below keeps the adjustment from being applied twice in them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_MARKER = "LOOPWRIGHT_TEST_ISOLATED"
_REDIS_DB = re.compile(r"^(?P<base>rediss?://[^/]+)(?:/(?P<db>\d+))?(?P<rest>\?.*)?$")


def _shift_redis_db(url: str, offset: int) -> str:
    match = _REDIS_DB.match(url)
    if match is None:
        return url
    db = int(match["db"] or 0) + offset
    if db > 15:
        raise RuntimeError(f"xdist worker needs Redis database {db}; a default Redis has 0-15")
    return f"{match['base']}/{db}{match['rest'] or ''}"


def _isolate_xdist_worker() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker or os.environ.get(_MARKER):
        return
    index = int(worker.removeprefix("gw"))
    root = Path(__file__).resolve().parents[1]
    var_dir = Path(os.environ.get("LOOPWRIGHT_VAR_DIR", root / "var")) / worker
    var_dir.mkdir(parents=True, exist_ok=True)
    os.environ["LOOPWRIGHT_VAR_DIR"] = str(var_dir)
    for name in ("CELERY_BROKER_URL", "REDIS_URL"):
        if os.environ.get(name):
            os.environ[name] = _shift_redis_db(os.environ[name], index)
    os.environ[_MARKER] = worker


_isolate_xdist_worker()

from orchestrator.settings import *  # noqa: E402, F403

# Every test client builds its own middleware stack, and WhiteNoise (WHITENOISE_USE_FINDERS)
# would list every static file of every app (about 170, ~28 ms) each time: thousands of times in
# a run. In autorefresh mode it looks a file up only when one is asked for; the answers are the
# same (production serves the collected STATIC_ROOT, docs/deployment.md).
WHITENOISE_AUTOREFRESH = True
