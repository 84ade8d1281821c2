"""Issuing and revoking API tokens for admins (the API's ``/api/v1/api-tokens`` and the UI's
API tokens page), with the semantics of ``manage.py create_api_token``.

Holds: a refused issue is an InvalidInput naming each bad field and changes nothing (the user,
its roles and the token are written in one transaction); the full token exists only in the
value returned by :func:`api_token_issue`; a revoked token keeps its first ``revoked_at`` and
is refused by every authentication path from the next request on.

Apart from :mod:`orchestrator.accounts.services` for the reason given in
:mod:`orchestrator.accounts.token_quotas`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal

from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from orchestrator.accounts.models import ApiToken
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import (
    api_token_create,
    api_token_quota_problems,
    api_token_split,
    user_ensure,
)
from orchestrator.errors import invalid_fields

#: The longest username and token name the columns take.
USERNAME_MAX, NAME_MAX = 150, 100


def _problem(field: str, detail: str) -> dict[str, str]:
    return {"pointer": f"/{field}", "detail": detail, "code": "invalid"}


def _username_problems(username: str) -> list[dict[str, str]]:
    if not username or len(username) > USERNAME_MAX:
        return [_problem("username", f"username must be 1 to {USERNAME_MAX} characters.")]
    try:
        UnicodeUsernameValidator()(username)
    except ValidationError:
        return [_problem("username", "username may hold only letters, digits and @ . + - _")]
    return []


def issue_problems(
    *,
    username: str,
    roles: Iterable[str],
    name: str,
    expires_at: datetime | None,
    quotas: dict[str, int | Decimal | None],
    now: datetime,
) -> list[dict[str, str]]:
    """``{pointer, detail, code}`` for each field of a token to issue that may not be stored."""
    problems = _username_problems(username)
    known = {r.value for r in Role}
    wanted = list(roles)
    if not wanted or any(r not in known for r in wanted):
        problems.append(_problem("roles", f"roles must be one or more of {sorted(known)}."))
    if not name.strip() or len(name) > NAME_MAX:
        problems.append(_problem("name", f"name must be 1 to {NAME_MAX} characters."))
    if expires_at is not None and expires_at <= now:
        problems.append(_problem("expires_at", "expires_at must be in the future."))
    return problems + api_token_quota_problems(quotas)


def api_token_issue(
    *,
    username: str,
    roles: Iterable[str],
    name: str = "cli",
    expires_at: datetime | None = None,
    daily_token_quota: int | None = None,
    daily_cost_quota: Decimal | None = None,
) -> tuple[ApiToken, str]:
    """Create the user if needed, grant it ``roles`` and make a token for it, as
    ``manage.py create_api_token`` does: ``(the row, the full token)``; the token is never
    stored, only the hash of its secret. InvalidInput naming each bad field (nothing written)."""
    wanted = list(dict.fromkeys(roles))
    quotas: dict[str, int | Decimal | None] = {
        "daily_token_quota": daily_token_quota,
        "daily_cost_quota": daily_cost_quota,
    }
    problems = issue_problems(
        username=username,
        roles=wanted,
        name=name,
        expires_at=expires_at,
        quotas=quotas,
        now=timezone.now(),
    )
    if problems:
        raise invalid_fields(problems)
    with transaction.atomic():
        user = user_ensure(username=username, roles=[Role(r) for r in wanted])
        token = api_token_create(
            user=user,
            name=name.strip(),
            expires_at=expires_at,
            daily_token_quota=daily_token_quota,
            daily_cost_quota=daily_cost_quota,
        )
        split = api_token_split(token)
        assert split is not None
        row = ApiToken.objects.select_related("user").get(prefix=split[0])
    return row, token


def api_token_revoke(*, token: ApiToken) -> ApiToken:
    """Revoke the token now (idempotent: a revoked token keeps its first ``revoked_at``)."""
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    token.refresh_from_db()
    return token
