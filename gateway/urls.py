"""``/api/v1/...`` routes of the gateway's configuration API (mounted with the other apps)."""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from gateway.api import ChatCompletionRecordViewSet, EmployeeGrantViewSet, EmployeeGuardrailsView

router = SimpleRouter(trailing_slash=False)
router.register("employee-grants", EmployeeGrantViewSet, basename="employee-grant")
router.register("chat-completions", ChatCompletionRecordViewSet, basename="chat-completion")

urlpatterns = [
    *router.urls,
    path(
        "employees/<slug:username>/guardrails",
        EmployeeGuardrailsView.as_view(),
        name="employee-guardrails",
    ),
]
