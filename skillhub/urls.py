from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from skillhub.api import ExecutionViewSet, SkillViewSet
from skillhub.api_directories import SkillDirectoryViewSet
from skillhub.api_env import SkillEnvironmentView
from skillhub.api_snapshots import urlpatterns as snapshot_urls
from skillhub.api_versions import (
    RegistryInstallView,
    RegistryListView,
    SkillRollbackView,
    SkillVersionsView,
)

router = SimpleRouter(trailing_slash=False)
router.register("skills", SkillViewSet, basename="skill")
router.register("skill-executions", ExecutionViewSet, basename="skill-execution")
router.register("skill-directories", SkillDirectoryViewSet, basename="skill-directory")

# Before the router: its skills/{tool_name} would take these paths.
urlpatterns = [
    *snapshot_urls,
    path("skills/registry/list", RegistryListView.as_view(), name="skill-registry-list"),
    path("skills/registry/install", RegistryInstallView.as_view(), name="skill-registry-install"),
    path("skills/<slug:tool_name>/versions", SkillVersionsView.as_view(), name="skill-versions"),
    path("skills/<slug:tool_name>/rollback", SkillRollbackView.as_view(), name="skill-rollback"),
    path("skills/<slug:tool_name>/env", SkillEnvironmentView.as_view(), name="skill-env"),
    *router.urls,
]
