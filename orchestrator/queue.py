"""Enqueue a Celery task by name, after the current transaction commits.

Services name tasks as strings (``"loops.drive_run"``) and never import task modules, so the
task modules may import services and no cycle forms. The message leaves once the transaction
commits (at once outside one), so a rolled-back write sends nothing; routing to queues is the
Celery app's (``task_routes`` in ``orchestrator.celery``). A broker that cannot take the
message is logged, never raised: every message is a wake-up call that a poller repeats.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from orchestrator.celery import app

logger = logging.getLogger(__name__)


def enqueue(task_name: str, *args: Any, **options: Any) -> None:
    """Send ``task_name(*args)`` once the transaction commits; ``options`` go to ``send_task``
    (``queue``, ``retry``...)."""
    transaction.on_commit(lambda: _send(task_name, *args, **options))


def _send(task_name: str, *args: Any, **options: Any) -> None:
    """Send ``task_name(*args)`` now; a broker that refuses it is logged."""
    try:
        app.send_task(task_name, args=args, **options)
    except Exception as exc:  # broker down: the task's poller finds the work later
        logger.warning("could not enqueue %s%r (%s)", task_name, args, type(exc).__name__)
