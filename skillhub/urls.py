from __future__ import annotations

from rest_framework.routers import SimpleRouter

from skillhub.api import ExecutionViewSet, SkillViewSet
from skillhub.api_directories import SkillDirectoryViewSet

router = SimpleRouter(trailing_slash=False)
router.register("skills", SkillViewSet, basename="skill")
router.register("skill-executions", ExecutionViewSet, basename="skill-execution")
router.register("skill-directories", SkillDirectoryViewSet, basename="skill-directory")

urlpatterns = [*router.urls]
