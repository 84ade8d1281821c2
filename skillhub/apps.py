from __future__ import annotations

from django.apps import AppConfig


class SkillhubConfig(AppConfig):
    name = "skillhub"
    verbose_name = "Skill Hub"
