"""``manage.py create_api_token <username> --role <role>``: prints only the token, for scripts."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure


class Command(BaseCommand):
    help = "Create (if needed) a user with the given role and print a new API token for it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--role",
            action="append",
            choices=[r.value for r in Role],
            required=True,
            help="role to grant (repeatable): admin, operator, approver or viewer",
        )
        parser.add_argument("--name", default="cli", help="a label for the token")

    def handle(self, *args: Any, **options: Any) -> None:
        roles = [Role(r) for r in options["role"]]
        user = user_ensure(username=options["username"], roles=roles)
        self.stdout.write(api_token_create(user=user, name=options["name"]))
