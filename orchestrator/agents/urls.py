from __future__ import annotations

from rest_framework.routers import SimpleRouter

from orchestrator.agents.api import (
    SLUG,
    EmployeeViewSet,
    ModelAliasViewSet,
    ModelEndpointViewSet,
    SubAgentBindingViewSet,
)

router = SimpleRouter(trailing_slash=False)
router.register("model-endpoints", ModelEndpointViewSet, basename="model-endpoint")
router.register("model-aliases", ModelAliasViewSet, basename="model-alias")
router.register(
    rf"employees/(?P<username>{SLUG})/sub-agents", SubAgentBindingViewSet, basename="sub-agent"
)
router.register("employees", EmployeeViewSet, basename="employee")

urlpatterns = router.urls
