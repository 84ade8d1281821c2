"""``GET /metrics``: the Prometheus text exposition of this host's processes and the database's
state (docs/observability.md). Open unless ``LOOPWRIGHT_METRICS_TOKEN`` is set; then only
``Authorization: Bearer <token>`` is answered (401 otherwise)."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client.exposition import choose_encoder

from orchestrator.metrics import scrape_registry


def _authorized(request: HttpRequest) -> bool:
    token = str(settings.METRICS_TOKEN)
    if not token:
        return True
    given = request.headers.get("Authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


@require_GET
def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    """Every metric in Prometheus's text format (0.0.4, or what ``Accept`` asks for: text 1.0.0
    or OpenMetrics), as ``prometheus_client`` negotiates it."""
    if not _authorized(request):
        response = HttpResponse("metrics need a bearer token\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encode(scrape_registry(with_state=True)), content_type=content_type)
