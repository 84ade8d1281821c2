from __future__ import annotations

from rest_framework.routers import SimpleRouter

from harness.api import HarnessProfileViewSet

router = SimpleRouter(trailing_slash=False)
router.register("harness-profiles", HarnessProfileViewSet, basename="harness-profile")

urlpatterns = router.urls
