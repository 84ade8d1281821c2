"""Celery tasks of ``knowledge`` (queue ``loops``, the default): thin wrappers over its
services."""

from __future__ import annotations

from celery import shared_task

from knowledge.services_bases import knowledge_reembed_by_key


@shared_task(name="knowledge.reembed", ignore_result=True, time_limit=3600)
def reembed(key: str) -> int:
    """Re-embed the chunks of base ``key`` made with another model (or none)."""
    return knowledge_reembed_by_key(key)
