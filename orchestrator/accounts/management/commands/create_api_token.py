"""``manage.py create_api_token <username> --role <role> [--daily-token-quota N]
[--daily-cost-quota X]``: prints only the token, for scripts."""

from __future__ import annotations

import argparse
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from orchestrator.accounts.token_quotas import api_token_quotas_check
from orchestrator.errors import InvalidInput


def _cost(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value.is_finite():
        raise argparse.ArgumentTypeError(f"not a number: {text!r}")
    return value


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
        parser.add_argument(
            "--daily-token-quota",
            type=int,
            help="the most tokens (prompt + completion) the token's chat completions may use "
            "per UTC day (default: no quota)",
        )
        parser.add_argument(
            "--daily-cost-quota",
            type=_cost,
            help="the most cost (endpoint prices) the token's chat completions may use per UTC "
            "day (default: no quota)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        roles = [Role(r) for r in options["role"]]
        quotas = {f: options[f] for f in ("daily_token_quota", "daily_cost_quota")}
        try:
            api_token_quotas_check(quotas)  # before the user is made
        except InvalidInput as exc:
            raise CommandError(exc.detail) from exc
        with transaction.atomic():
            user = user_ensure(username=options["username"], roles=roles)
            self.stdout.write(api_token_create(user=user, name=options["name"], **quotas))
