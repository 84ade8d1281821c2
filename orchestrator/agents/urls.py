from __future__ import annotations

from rest_framework.routers import SimpleRouter

from orchestrator.agents.api import EmployeeViewSet, ModelEndpointViewSet

router = SimpleRouter(trailing_slash=False)
router.register("model-endpoints", ModelEndpointViewSet, basename="model-endpoint")
router.register("employees", EmployeeViewSet, basename="employee")

urlpatterns = router.urls
