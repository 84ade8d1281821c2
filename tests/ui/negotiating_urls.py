"""The project's URLconf with the UI's content-negotiating error handlers (what the lead is asked
to set in orchestrator/urls.py), so the handlers are tested as they would be mounted."""

from __future__ import annotations

from orchestrator.urls import urlpatterns

handler400 = "frontend.errors.handler400"
handler403 = "frontend.errors.handler403"
handler404 = "frontend.errors.handler404"
handler500 = "frontend.errors.handler500"

__all__ = ["handler400", "handler403", "handler404", "handler500", "urlpatterns"]
