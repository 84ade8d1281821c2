from __future__ import annotations

from rest_framework.routers import SimpleRouter

from instructions.api import InstructionViewSet

router = SimpleRouter(trailing_slash=False)
router.register("instructions", InstructionViewSet, basename="instruction")

urlpatterns = router.urls
