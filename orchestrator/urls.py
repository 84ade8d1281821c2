from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from orchestrator.health import healthz, readyz
from orchestrator.metrics_view import prometheus_metrics

# HTML for people on UI paths, problem+json for the API and scripts (content-negotiated).
handler400 = "frontend.errors.handler400"
handler403 = "frontend.errors.handler403"
handler404 = "frontend.errors.handler404"
handler500 = "frontend.errors.handler500"


class FaviconRedirect(RedirectView):
    """``/favicon.ico`` for browsers and tools that ask for it: the UI's SVG icon."""

    permanent = True
    http_method_names = ["get", "head"]

    def get_redirect_url(self, *args: Any, **kwargs: Any) -> str:
        return static("frontend/favicon.svg")


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    # Prometheus text for scrapers (docs/observability.md); the HTML page is /ui/metrics.
    path("metrics", prometheus_metrics, name="metrics"),
    path("favicon.ico", FaviconRedirect.as_view(), name="favicon"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
    path("api/v1/", include("loops.urls")),
    path("api/v1/", include("harness.urls")),
    path("api/v1/", include("instructions.urls")),
    path("api/v1/", include("orchestrator.agents.urls")),
    path("api/v1/", include("skillhub.urls")),
    path("api/v1/", include("gateway.urls")),
    path("api/v1/", include("connectors.urls")),
    path("api/v1/", include("memory.urls")),
    path("api/v1/", include("knowledge.urls")),
    path("api/v1/", include("orchestrator.accounts.urls")),
    # OpenAI-compatible: AI employees as models (docs/openai-endpoint.md).
    path("v1/", include("gateway.openai_urls")),
    path("", include("frontend.urls")),
]
