"""Role permissions for DRF views. Reads need any role; writes name the role they need."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from orchestrator.accounts.roles import Role, has_role, user_roles


class _RolePermission(BasePermission):
    roles: tuple[Role, ...] = ()
    message = "Your role does not allow this action."

    def has_permission(self, request: Request, view: Any) -> bool:
        return has_role(request.user, *self.roles)


class IsViewer(_RolePermission):
    """Any role at all: every authenticated user with a Loopwright role may read."""

    def has_permission(self, request: Request, view: Any) -> bool:
        return bool(user_roles(request.user))


class IsOperator(_RolePermission):
    roles = (Role.OPERATOR,)


class IsAdmin(_RolePermission):
    roles = (Role.ADMIN,)


class ReadOrOperator(BasePermission):
    """Safe methods for any role; writes for operators (and admins)."""

    message = "Your role does not allow this action."

    def has_permission(self, request: Request, view: Any) -> bool:
        if request.method in SAFE_METHODS:
            return bool(user_roles(request.user))
        return has_role(request.user, Role.OPERATOR)


class ReadOrAdmin(BasePermission):
    message = "Your role does not allow this action."

    def has_permission(self, request: Request, view: Any) -> bool:
        if request.method in SAFE_METHODS:
            return bool(user_roles(request.user))
        return has_role(request.user, Role.ADMIN)
