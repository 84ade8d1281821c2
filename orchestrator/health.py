"""Liveness and readiness probes.

``/healthz`` is cheap (this process and its database); ``/readyz`` checks what serving work
needs: the database, the Celery broker and, when configured, Redis. Each answers 200 when all
its checks pass and 503 naming the ones that failed (never a secret: only the kind of error).
"""

from __future__ import annotations

from collections.abc import Callable

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from orchestrator.celery import app as celery_app

#: How long one dependency may take to answer the readiness probe.
READY_TIMEOUT_SECONDS = 2


def _database() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return connection.vendor


def _broker() -> str:
    with celery_app.connection_for_write() as broker:
        broker.ensure_connection(max_retries=1, timeout=READY_TIMEOUT_SECONDS)
        return str(broker.transport_cls)


def _redis() -> str:
    if not settings.REDIS_URL:
        return "not configured"
    client = redis.Redis.from_url(
        settings.REDIS_URL,
        socket_connect_timeout=READY_TIMEOUT_SECONDS,
        socket_timeout=READY_TIMEOUT_SECONDS,
    )
    try:
        client.ping()
    finally:
        client.close()
    return "ok"


def _checked(checks: dict[str, Callable[[], str]]) -> JsonResponse:
    found: dict[str, str] = {}
    failed = []
    for name, check in checks.items():
        try:
            found[name] = check()
        except Exception as exc:  # a probe reports, it must not raise
            found[name] = f"error: {type(exc).__name__}"
            failed.append(name)
    status = "error" if failed else "ok"
    return JsonResponse({"status": status, **found}, status=503 if failed else 200)


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """The process is up and can reach its database."""
    return _checked({"database": _database})


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """The process can serve work: its database, its broker and Redis (when set) answer."""
    return _checked({"database": _database, "broker": _broker, "redis": _redis})
