from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from loops.api import PatternViewSet, RunViewSet
from loops.api_approvals import ApprovalViewSet
from loops.api_streams import RunStreamView
from loops.api_triggers import EventIngestView, EventKeyViewSet, PatternScheduleView

router = SimpleRouter(trailing_slash=False)
router.register("patterns", PatternViewSet, basename="pattern")
router.register("runs", RunViewSet, basename="run")
router.register("approvals", ApprovalViewSet, basename="approval")
router.register("event-keys", EventKeyViewSet, basename="event-key")

urlpatterns = [
    *router.urls,
    path("events/<str:event_key>", EventIngestView.as_view(), name="event-deliver"),
    path("patterns/<str:key>/schedule", PatternScheduleView.as_view(), name="pattern-schedule"),
    path("runs/<str:pk>/stream", RunStreamView.as_view(), name="run-stream"),
]
