from __future__ import annotations

from rest_framework.routers import SimpleRouter

from loops.api import PatternViewSet, RunViewSet
from loops.api_approvals import ApprovalViewSet

router = SimpleRouter(trailing_slash=False)
router.register("patterns", PatternViewSet, basename="pattern")
router.register("runs", RunViewSet, basename="run")
router.register("approvals", ApprovalViewSet, basename="approval")

urlpatterns = [
    *router.urls,
]
