"""Writes for users, roles and tokens."""

from __future__ import annotations

import hmac
from datetime import datetime

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


def api_token_resolve(raw: str) -> ApiToken | None:
    """The live token matching ``raw``, or None (constant-time comparison of the secret)."""
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        return None
    token = ApiToken.objects.select_related("user").filter(prefix=parts[1]).first()
    if token is None or not hmac.compare_digest(token.secret_hash, hash_secret(parts[2])):
        return None
    now = timezone.now()
    if token.revoked_at is not None or (token.expires_at is not None and token.expires_at <= now):
        return None
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token
