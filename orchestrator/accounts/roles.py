"""Roles are Django groups. A user may hold several; a superuser holds all of them.

- viewer: reads everything.
- approver: reads, and decides approvals.
- operator: reads, triggers runs, acts on runs and manages patterns and other configuration.
- admin: everything, including policy profiles and tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
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
    groups = () if user.is_superuser else user.groups.values_list("name", flat=True)
    roles = roles_of(superuser=user.is_superuser, groups=groups)
    user._loopwright_roles = roles
    return roles


def roles_of(*, superuser: bool, groups: Iterable[str]) -> frozenset[Role]:
    """The roles of a user holding the groups named ``groups``: all of them for a superuser or
    an admin; other group names grant nothing."""
    names = set(groups)
    roles = frozenset(r for r in ALL_ROLES if r.value in names)
    return frozenset(ALL_ROLES) if superuser or Role.ADMIN in roles else roles


def user_roles_known(user: Any, roles: frozenset[Role]) -> None:
    """Cache ``roles``, read with the user in the same statement, as the user's for the
    request: :func:`user_roles` then issues no query."""
    user._loopwright_roles = roles


def has_role(user: Any, *allowed: Role) -> bool:
    roles = user_roles(user)
    return Role.ADMIN in roles or any(r in roles for r in allowed)
