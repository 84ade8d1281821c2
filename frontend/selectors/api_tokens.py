"""The API tokens as the API tokens page lists them (admins only): who each acts as, with the
user's roles, and its dates and quotas. Never a secret or its hash."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.utils import timezone

from orchestrator.accounts.models import ApiToken
from orchestrator.accounts.roles import ALL_ROLES, Role


@dataclass(frozen=True)
class TokenRow:
    """One token as listed; ``state`` is live, expired or revoked."""

    prefix: str
    username: str
    name: str
    roles: list[str]
    created_at: datetime
    last_used_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None
    daily_token_quota: int | None
    daily_cost_quota: Decimal | None
    state: str


def _roles(user: object, group_names: set[str]) -> list[str]:
    """The user's roles, strongest first (admin stands alone, as it implies the others)."""
    if getattr(user, "is_superuser", False) or Role.ADMIN.value in group_names:
        return [Role.ADMIN.value]
    return [r.value for r in ALL_ROLES if r.value in group_names]


def _state(token: ApiToken, now: datetime) -> str:
    if token.revoked_at is not None:
        return "revoked"
    if token.expires_at is not None and token.expires_at <= now:
        return "expired"
    return "live"


def tokens(now: datetime | None = None) -> list[TokenRow]:
    """Every token, newest first."""
    now = now or timezone.now()
    rows = []
    for token in ApiToken.objects.select_related("user").prefetch_related("user__groups"):
        groups = {g.name for g in token.user.groups.all()}
        rows.append(
            TokenRow(
                prefix=token.prefix,
                username=token.user.get_username(),
                name=token.name,
                roles=_roles(token.user, groups),
                created_at=token.created_at,
                last_used_at=token.last_used_at,
                expires_at=token.expires_at,
                revoked_at=token.revoked_at,
                daily_token_quota=token.daily_token_quota,
                daily_cost_quota=token.daily_cost_quota,
                state=_state(token, now),
            )
        )
    return rows
