"""``/api/v1/...`` routes of the accounts app (mounted with the other apps)."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from orchestrator.accounts.api import ApiTokenViewSet

router = SimpleRouter(trailing_slash=False)
router.register("api-tokens", ApiTokenViewSet, basename="api-token")

urlpatterns = router.urls
