from __future__ import annotations

from rest_framework.routers import SimpleRouter

from skillhub.api import ExecutionViewSet, SkillViewSet

router = SimpleRouter(trailing_slash=False)
router.register("skills", SkillViewSet, basename="skill")
router.register("skill-executions", ExecutionViewSet, basename="skill-execution")

urlpatterns = [*router.urls]
