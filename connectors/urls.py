from __future__ import annotations

from rest_framework.routers import SimpleRouter

from connectors.api import McpServerViewSet

router = SimpleRouter(trailing_slash=False)
router.register("mcp-servers", McpServerViewSet, basename="mcp-server")

urlpatterns = router.urls
