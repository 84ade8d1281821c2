from __future__ import annotations

from django.apps import AppConfig


class InstructionsConfig(AppConfig):
    name = "instructions"
    verbose_name = "Prompt instructions"
