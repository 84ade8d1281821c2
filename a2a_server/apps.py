from __future__ import annotations

from django.apps import AppConfig


class A2AServerConfig(AppConfig):
    name = "a2a_server"
    verbose_name = "Patterns as A2A agents"
