"""Celery tasks of ``connectors`` (queue ``loops``): thin wrappers over its services."""

from __future__ import annotations

from celery import shared_task

from connectors.a2a_services import a2a_calls_cancel_waiting


@shared_task(name="connectors.cancel_abandoned_a2a_calls", ignore_result=True, time_limit=700)
def cancel_abandoned_a2a_calls(keys: list[str]) -> None:
    """Cancel the remote tasks of calls whose run ended while the agent waited for input."""
    a2a_calls_cancel_waiting(keys)
