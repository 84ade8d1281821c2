"""Writes for users, roles and tokens."""

from __future__ import annotations

import hmac
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.db.models import IntegerField
from django.db.models.expressions import RawSQL
from django.utils import timezone

from orchestrator.accounts.models import TOKEN_PREFIX, ApiToken, generate_token, hash_secret
from orchestrator.accounts.roles import ALL_ROLES, Role, roles_of, user_roles_known

#: The quota fields of a token (``None``: no quota on that metric).
QUOTA_FIELDS = ("daily_token_quota", "daily_cost_quota")


@transaction.atomic
def user_ensure(*, username: str, roles: list[Role] | tuple[Role, ...] = ()) -> User:
    """Create the user if needed and add the given roles (groups)."""
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(username=username)
    for role in roles:
        group, _ = Group.objects.get_or_create(name=role.value)
        user.groups.add(group)
    return user


def api_token_create(
    *,
    user: User,
    name: str = "cli",
    expires_at: datetime | None = None,
    daily_token_quota: int | None = None,
    daily_cost_quota: Decimal | None = None,
) -> str:
    """Create a token for the user and return it; only its hash is stored. ValueError for a
    quota :func:`api_token_quota_problems` refuses."""
    quotas = {"daily_token_quota": daily_token_quota, "daily_cost_quota": daily_cost_quota}
    problems = api_token_quota_problems(quotas)
    if problems:
        raise ValueError(problems[0]["detail"])
    token, prefix, secret_hash = generate_token()
    ApiToken.objects.create(
        user=user,
        name=name,
        prefix=prefix,
        secret_hash=secret_hash,
        expires_at=expires_at,
        **quotas,
    )
    return token


#: The quota columns: a 64-bit integer; 12 digits, 4 of them decimals.
_TOKEN_BOUND, _COST_STEP, _COST_BOUND = 2**63 - 1, Decimal("0.0001"), Decimal("1e8")


def _quota_problem(field: str, value: Any) -> str:
    """Why ``value`` cannot be the quota ``field`` ('' when it can; None is no quota)."""
    if value is None:
        return ""
    if value < 0:
        return f"{field} must not be negative (null: no quota)."
    if field == "daily_token_quota" and value > _TOKEN_BOUND:
        return f"{field} must be at most {_TOKEN_BOUND}."
    if field == "daily_cost_quota" and (
        value >= _COST_BOUND or Decimal(value) != Decimal(value).quantize(_COST_STEP)
    ):
        return f"{field} must be below 100,000,000 with at most 4 decimals."
    return ""


def api_token_quota_problems(values: dict[str, Any]) -> list[dict[str, str]]:
    """``{pointer, detail, code}`` for each quota of ``values`` that does not fit its column or
    is negative (none: all may be stored)."""
    return [
        {"pointer": f"/{field}", "detail": detail, "code": "invalid"}
        for field, value in values.items()
        if (detail := _quota_problem(field, value))
    ]


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


#: The 401 details of the bearer-token check (docs/api.md, "Authentication answers"): what is
#: wrong, never which of unknown, revoked or expired (that would tell a guesser a prefix exists).
TOKEN_MALFORMED = "Malformed API token: a Loopwright API token reads 'lw_<prefix>_<secret>'."  # noqa: S105
TOKEN_REFUSED = "Unknown, revoked or expired API token: ask an admin for a new one."  # noqa: S105


class TokenRefused(ValueError):
    """A bearer token the service does not accept; ``str()`` is the 401's detail."""


def api_token_authenticate(header: str) -> ApiToken:
    """The live token of an ``Authorization`` header's value (``Bearer lw_…``) whose user is
    active; :class:`TokenRefused` naming what is wrong otherwise (another scheme, malformed,
    or unknown/revoked/expired/inactive: one message for those). No header at all is the
    caller's to answer (``orchestrator.errors.NO_CREDENTIALS``)."""
    scheme, _, raw = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise TokenRefused(
            f"The Authorization scheme {safe_scheme(scheme)!r} is not accepted: send "
            "'Authorization: Bearer <API token>'."
        )
    raw = raw.strip()
    if not raw or api_token_split(raw) is None:
        raise TokenRefused(TOKEN_MALFORMED)
    token = api_token_resolve(raw)
    if token is None or not token.user.is_active:
        raise TokenRefused(TOKEN_REFUSED)
    return token


def safe_scheme(scheme: str) -> str:
    """An ``Authorization`` scheme as it may be echoed: at most 20 printable ASCII characters."""
    shown = "".join(c for c in scheme[:20] if c.isascii() and c.isprintable())
    return shown + ("…" if len(scheme) > 20 else "")


def api_token_resolve(raw: str) -> ApiToken | None:
    """The live token matching ``raw``, or None (constant-time comparison of the secret). One
    statement reads the token, its user and the user's roles (cached on the user for the
    request, :func:`orchestrator.accounts.roles.user_roles`)."""
    split = api_token_split(raw)
    if split is None:
        return None
    prefix, secret = split
    token = (
        ApiToken.objects.select_related("user")
        .annotate(role_bits=_role_bits())
        .filter(prefix=prefix)
        .first()
    )
    now = timezone.now()
    if token is None or not api_token_live(secret, token, now):
        return None
    api_token_touch(token.pk, token.last_used_at, now)
    bits = int(getattr(token, "role_bits", 0))
    held = [role.value for i, role in enumerate(ALL_ROLES) if bits >> i & 1]
    user_roles_known(token.user, roles_of(superuser=token.user.is_superuser, groups=held))
    return token


#: Per token row: bit ``i`` set when its user is in the group of ``ALL_ROLES[i]`` (a sum of
#: distinct bits: a user is in a group at most once and group names are unique). Constant text
#: (S608 waived): the role names and their bits are parameters.
ROLE_BITS_SQL = (
    "(SELECT COALESCE(SUM(CASE r.name "  # noqa: S608
    + " ".join("WHEN %s THEN %s" for _ in ALL_ROLES)
    + " ELSE 0 END), 0) FROM auth_user_groups ug JOIN auth_group r ON r.id = ug.group_id "
    "WHERE ug.user_id = accounts_apitoken.user_id)"
)
ROLE_BITS_PARAMS = tuple(p for i, role in enumerate(ALL_ROLES) for p in (role.value, 1 << i))


def _role_bits() -> RawSQL:
    return RawSQL(ROLE_BITS_SQL, ROLE_BITS_PARAMS, output_field=IntegerField())  # noqa: S611
