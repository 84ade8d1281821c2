"""``manage.py seed_demo``: the demo's login, its scripted model, employees, repository and
pattern (idempotent; prints how to log in and how to approve the demo's gated write)."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from loops.models import LoopPattern, LoopRun
from loops.services.patterns import pattern_create
from loops.services.runs import run_trigger
from orchestrator.agents.models import Employee, ModelEndpoint
from orchestrator.agents.services import employee_create, model_endpoint_create

DEMO_EMPLOYEES: dict[str, dict[str, Any]] = {
    "demo-leader": {
        "display_name": "Demo leader",
        "system_prompt": "You are the demo team's planner (role:leader).",
        "tools": ["read", "list"],
    },
    "demo-maker": {
        "display_name": "Demo maker",
        "system_prompt": "You are the demo team's editor (role:maker).",
        "tools": ["read", "list", "write", "edit"],
    },
    "demo-verifier": {
        "display_name": "Demo verifier",
        "system_prompt": "You are the demo team's independent reviewer (role:verifier).",
        "tools": ["read", "list"],
    },
}


def demo_pattern(repo: Path) -> dict[str, Any]:
    return {
        "key": "demo-hello",
        "title": "Demo: improve a greeting",
        "description": (
            "The leader plans, the maker edits hello.txt in the run's own git worktree (the "
            "write waits for a human approval), an independent verifier judges."
        ),
        "goal_template": "Improve the greeting in `{{ inputs.get('path', 'hello.txt') }}`.",
        "leader_username": "demo-leader",
        "maker_usernames": ["demo-maker"],
        "verifier_username": "demo-verifier",
        "repository_key": "demo",
        "repository_root": str(repo),
        "base_ref": "main",
        "acting_on": ["hello.txt"],
    }


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def ensure_demo_repository(path: Path) -> Path:
    if (path / ".git").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q", "-b", "main")
    (path / "hello.txt").write_text("Hello, world.\n")
    _git(path, "add", "hello.txt")
    _git(
        path, "-c", "user.name=Loopwright demo", "-c", "user.email=demo@loopwright.invalid",
        "commit", "-q", "-m", "A greeting to improve",
    )  # fmt: skip
    return path


def ensure_demo_team() -> None:
    endpoint = ModelEndpoint.objects.filter(name="scripted-demo").first()
    if endpoint is None:
        endpoint = model_endpoint_create(
            name="scripted-demo",
            provider="scripted",
            script="demo",
            model="loopwright-scripted",
        )
    for username, fields in DEMO_EMPLOYEES.items():
        if not Employee.objects.filter(username=username).exists():
            employee_create(username=username, endpoint=endpoint, **fields)


class Command(BaseCommand):
    help = "Create the demo login, scripted model, employees, repository and pattern if missing."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--no-run", action="store_true", help="do not start a demo run when none exists yet"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        password = self._admin_password()
        repo = ensure_demo_repository(Path(settings.VAR_DIR) / "demo-repo")
        ensure_demo_team()
        pattern = LoopPattern.objects.filter(key="demo-hello").first()
        if pattern is None:
            pattern = pattern_create(actor="seed", **demo_pattern(repo))
        if not options["no_run"] and not LoopRun.objects.filter(pattern=pattern).exists():
            run = run_trigger(pattern=pattern, actor="seed", inputs={"path": "hello.txt"})
            self.stdout.write(f"Started demo run {run.id}.")
        self.stdout.write(
            _INSTRUCTIONS.format(password=password, var=settings.VAR_DIR, url=settings.PUBLIC_URL)
        )

    def _admin_password(self) -> str:
        path = Path(settings.VAR_DIR) / "admin-password"
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


_INSTRUCTIONS = """
Log in at {url}/ as 'admin' with password '{password}'
(it is kept in {var}/admin-password).
The demo run plans, then its maker proposes a gated `write` and waits for your approval
(approve it in the UI, or with a token made here or on the API tokens page, {url}/api-tokens):
  TOKEN=$(.venv/bin/python manage.py create_api_token ops --role operator --role approver)
  curl -s -H "Authorization: Bearer $TOKEN" '{url}/api/v1/approvals?status=pending'
  curl -s -X POST -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \\
       -d '{{"decision": "approve"}}' {url}/api/v1/approvals/<approval id>/decide
API docs: {url}/api/docs/
"""
