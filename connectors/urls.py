from __future__ import annotations

from rest_framework.routers import SimpleRouter

from connectors.a2a_api import A2AAgentViewSet
from connectors.api import McpServerViewSet

router = SimpleRouter(trailing_slash=False)
router.register("mcp-servers", McpServerViewSet, basename="mcp-server")
router.register("a2a-agents", A2AAgentViewSet, basename="a2a-agent")

urlpatterns = router.urls
