"""Writes for users, roles and tokens."""

from __future__ import annotations

import hmac
from datetime import datetime
from typing import Protocol

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.utils import timezone

from orchestrator.accounts.models import TOKEN_PREFIX, ApiToken, generate_token, hash_secret
from orchestrator.accounts.roles import Role


@transaction.atomic
def user_ensure(*, username: str, roles: list[Role] | tuple[Role, ...] = ()) -> User:
    """Create the user if needed and add the given roles (groups)."""
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(username=username)
    for role in roles:
        group, _ = Group.objects.get_or_create(name=role.value)
        user.groups.add(group)
    return user


def api_token_create(*, user: User, name: str = "cli", expires_at: datetime | None = None) -> str:
    """Create a token for the user and return it; only its hash is stored."""
    token, prefix, secret_hash = generate_token()
    ApiToken.objects.create(
        user=user, name=name, prefix=prefix, secret_hash=secret_hash, expires_at=expires_at
    )
    return token


def api_token_split(raw: str) -> tuple[str, str] | None:
    """``(prefix, secret)`` of a token's text, or None when it is not shaped like one."""
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        return None
    return parts[1], parts[2]


class TokenState(Protocol):
    """What decides whether a token is live: an ``ApiToken``, or a row read elsewhere."""

    @property
    def secret_hash(self) -> str: ...
    @property
    def revoked_at(self) -> datetime | None: ...
    @property
    def expires_at(self) -> datetime | None: ...


def api_token_live(secret: str, token: TokenState, now: datetime) -> bool:
    """Whether ``secret`` is the token's (constant-time) and the token is neither revoked nor
    expired at ``now``."""
    if not hmac.compare_digest(token.secret_hash, hash_secret(secret)):
        return False
    return token.revoked_at is None and (token.expires_at is None or token.expires_at > now)


def api_token_touch(pk: int, last_used_at: datetime | None, now: datetime) -> None:
    """Record the token's use, at most once a minute."""
    if last_used_at is None or (now - last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=pk).update(last_used_at=now)


def api_token_resolve(raw: str) -> ApiToken | None:
    """The live token matching ``raw``, or None (constant-time comparison of the secret)."""
    split = api_token_split(raw)
    if split is None:
        return None
    prefix, secret = split
    token = ApiToken.objects.select_related("user").filter(prefix=prefix).first()
    now = timezone.now()
    if token is None or not api_token_live(secret, token, now):
        return None
    api_token_touch(token.pk, token.last_used_at, now)
    return token
