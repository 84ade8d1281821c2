"""``manage.py seed_demo``: the demo's login and pattern (idempotent; prints how to log in)."""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from loops.models import LoopPattern
from loops.services.patterns import pattern_create

DEMO_PATTERN: dict[str, Any] = {
    "key": "demo-hello",
    "title": "Demo: improve a greeting",
    "description": "Leader plans, a maker edits a file, an independent verifier judges.",
    "goal_template": "Improve the greeting in {{ inputs.get('file', 'hello.txt') }}.",
    "leader_username": "demo-leader",
    "maker_usernames": ["demo-maker"],
    "verifier_username": "demo-verifier",
}


class Command(BaseCommand):
    help = "Create the demo admin login and the demo pattern if they do not exist yet."

    def handle(self, *args: Any, **options: Any) -> None:
        password = self._admin_password()
        if not LoopPattern.objects.filter(key=DEMO_PATTERN["key"]).exists():
            pattern_create(actor="seed", **DEMO_PATTERN)
        self.stdout.write(
            "Log in at http://127.0.0.1:8000/admin/ as 'admin' with password "
            f"'{password}' (kept in {settings.VAR_DIR / 'admin-password'}).\n"
            "API docs: http://127.0.0.1:8000/api/docs/ ; an API token for scripts:\n"
            "  .venv/bin/python manage.py create_api_token ops --role operator"
        )

    def _admin_password(self) -> str:
        path = settings.VAR_DIR / "admin-password"
        user_model = get_user_model()
        if path.exists() and user_model.objects.filter(username="admin").exists():
            return path.read_text().strip()
        password = secrets.token_urlsafe(12)
        user, _ = user_model.objects.get_or_create(username="admin")
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        path.write_text(password)
        path.chmod(0o600)
        return password
