"""Whether a run was cancelled by a person, for tools that must then stop remote work.

A tool's asyncio task is cancelled for several reasons (the run was cancelled or paused, its
lease was lost, the worker is draining); only the first means remote work should stop, the
others resume the same call later. The run engine registers the probe that tells them apart
(``loops.apps``); without one, no run counts as cancelled.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

_probe: Callable[[uuid.UUID], bool] | None = None


def run_canceled_probe_register(probe: Callable[[uuid.UUID], bool]) -> None:
    """Install the engine's probe (blocking; call it from a worker thread)."""
    global _probe
    _probe = probe


def run_was_canceled(run_id: uuid.UUID) -> bool:
    """True when run ``run_id`` has been cancelled (blocking: it may read the database)."""
    return _probe is not None and _probe(run_id)
