"""Celery tasks of the ``skills`` queue: thin wrappers over the execution services.

A message names one execution; the worker claims the row (lease), so a duplicated or late
message does nothing and a lost one is re-sent by the poller.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid

from celery import shared_task

from skillhub.services.executions import execution_run, executions_recover


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


@shared_task(name="skillhub.execute", ignore_result=True, time_limit=900, soft_time_limit=870)
def execute_skill(execution_id: str) -> None:
    """Claim and run one skill execution in the sandbox."""
    execution_run(execution_id=uuid.UUID(execution_id), owner=_owner())


@shared_task(name="skillhub.recover", ignore_result=True, time_limit=120)
def recover_skill_executions() -> None:
    """The poller: re-queue executions of dead workers, nudge forgotten ones."""
    executions_recover()
