"""Whether a run was cancelled by a person, for tools that must then stop remote work.

A tool's asyncio task is cancelled for several reasons (the run was cancelled or paused, its
lease was lost, the worker is draining); only the first means remote work should stop, the
others resume the same call later. The run engine registers the probe that tells them apart
(``loops.apps``); without one, no run counts as cancelled. A run that ends while a call waits on
a question (no call is running then) tells the listeners of :func:`calls_abandoned`.
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


#: Told, after the commit that ended a run, the idempotency keys of its calls that waited on a
#: question nobody will now answer (a remote task left waiting for input), to stop their work.
_abandoned: list[Callable[[uuid.UUID, list[str]], None]] = []


def calls_abandoned_listener_register(listener: Callable[[uuid.UUID, list[str]], None]) -> None:
    """Install a listener (a tool provider with remote tasks; ``connectors.apps``)."""
    if listener not in _abandoned:
        _abandoned.append(listener)


def calls_abandoned(run_id: uuid.UUID, keys: list[str]) -> None:
    """Run ``run_id`` ended while calls of it (``keys``) waited on a question: tell the
    listeners (each must be quick: it hands the work on)."""
    for listener in list(_abandoned):
        listener(run_id, keys)
