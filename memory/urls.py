from __future__ import annotations

from rest_framework.routers import SimpleRouter

from memory.api import MemoryItemViewSet

router = SimpleRouter(trailing_slash=False)
router.register("memories", MemoryItemViewSet, basename="memory")

urlpatterns = router.urls
