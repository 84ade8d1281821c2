"""``/v1/...``: the OpenAI-compatible routes (mounted at the site root by orchestrator.urls)."""

from __future__ import annotations

from django.urls import path

from gateway import views

urlpatterns = [
    path("models", views.models, name="openai-models"),
    path("models/<str:model>", views.model, name="openai-model"),
    path("chat/completions", views.chat_completions, name="openai-chat-completions"),
]
