"""The Loopwright Django project: settings, URLs, ASGI app and the Celery app."""

from __future__ import annotations

from orchestrator.celery import app as celery_app

__all__ = ["celery_app"]
