"""View-only Django admin pages for the engine's tables (runs, steps, events, path locks,
executions, records...): the engine writes them, through its services and their invariants, so
the admin shows them and never adds, changes or deletes a row. Configuration (patterns,
employees, endpoints, profiles...) stays editable in each app's admin."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest


class ViewOnly:
    """Mix into a ``ModelAdmin`` or an inline: view permission only."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ViewOnlyAdmin(ViewOnly, admin.ModelAdmin[Any]):
    """A view-only admin page for an engine table."""
