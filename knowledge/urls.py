from __future__ import annotations

from rest_framework.routers import SimpleRouter

from knowledge.api import KnowledgeBaseViewSet, RetrievalViewSet

router = SimpleRouter(trailing_slash=False)
router.register("knowledge-bases", KnowledgeBaseViewSet, basename="knowledge-base")
router.register("retrievals", RetrievalViewSet, basename="retrieval")

urlpatterns = router.urls
