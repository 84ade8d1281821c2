from __future__ import annotations

from django.apps import AppConfig


class HarnessConfig(AppConfig):
    name = "harness"
    verbose_name = "Harness policy profiles"
