from __future__ import annotations

from django.apps import AppConfig


class LoopsConfig(AppConfig):
    name = "loops"
    verbose_name = "Agent loops"
