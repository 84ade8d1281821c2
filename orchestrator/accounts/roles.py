"""Roles are Django groups. A user may hold several; a superuser holds all of them.

- viewer: reads everything.
- approver: reads, and decides approvals.
- operator: reads, triggers runs, acts on runs and manages patterns and other configuration.
- admin: everything, including policy profiles and tokens.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Role(StrEnum):
    ADMIN = "admin"
    OPERATOR = "operator"
    APPROVER = "approver"
    VIEWER = "viewer"


ALL_ROLES = tuple(Role)


def user_roles(user: Any) -> frozenset[Role]:
    """The roles of a user, cached on the user object for the request."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return frozenset()
    cached = getattr(user, "_loopwright_roles", None)
    if cached is not None:
        return frozenset(cached)
    if user.is_superuser:
        roles = frozenset(ALL_ROLES)
    else:
        names = set(user.groups.values_list("name", flat=True))
        roles = frozenset(r for r in ALL_ROLES if r.value in names)
        if Role.ADMIN in roles:
            roles = frozenset(ALL_ROLES)
    user._loopwright_roles = roles
    return roles


def has_role(user: Any, *allowed: Role) -> bool:
    roles = user_roles(user)
    return Role.ADMIN in roles or any(r in roles for r in allowed)
