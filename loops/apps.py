from __future__ import annotations

from django.apps import AppConfig


class LoopsConfig(AppConfig):
    name = "loops"
    verbose_name = "Agent loops"

    def ready(self) -> None:
        from harness.checks import publish_check_register
        from loops.services.patterns import profile_publish_check

        # A profile publish that would make a pattern following its tag break the registration
        # check (autonomy and human gates, worktree and repository) is refused.
        publish_check_register(profile_publish_check)
