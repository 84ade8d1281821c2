"""Who may see and do what in the UI. Hiding a button is a courtesy; these checks are the rule.

Every page needs a Loopwright role (any role reads); every state-changing request names the role
it needs and is refused with a 403 page otherwise, whatever the page showed. Errors a view raises
on purpose (an unknown run, a refused role) become HTML pages here, so the UI never depends on
the project's problem+json handlers.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core import signals
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.urls import reverse

from frontend.errors import error_page, server_error_page
from orchestrator.accounts.roles import Role, has_role, user_roles
from orchestrator.errors import NotFound

logger = logging.getLogger(__name__)
View = Callable[..., HttpResponseBase]
SAFE_METHODS = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class Guard:
    """What a guarded view accepts and which role its writes (and form pages) need."""

    methods: frozenset[str]
    write: Role | None
    form_page: bool


#: Every guarded view and its guard, so tests can prove that each state-changing view is covered.
GUARDED: dict[View, Guard] = {}


def actor_of(request: HttpRequest) -> str:
    """Who acts, as the services record it (the username)."""
    return str(getattr(request.user, "username", "") or "anonymous")


def can(user: Any, role: Role) -> bool:
    """Whether ``user`` may do what ``role`` may (admins may do everything)."""
    return has_role(user, role)


def _refusal(request: HttpRequest, role: Role) -> HttpResponse:
    held = ", ".join(sorted(r.value for r in user_roles(request.user))) or "none"
    return error_page(
        request,
        403,
        "Not allowed",
        f"This needs the {role.value} role; your role is {held}. Nothing was changed.",
    )


def _gate(
    request: HttpRequest, methods: Collection[str], write: Role | None, form_page: bool
) -> HttpResponse | None:
    """A response that refuses the request, or None to let the view run."""
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path(), reverse("ui:login"))
    if not user_roles(request.user):
        return error_page(
            request,
            403,
            "No access",
            "Your account has no Loopwright role yet. Ask an administrator to grant one.",
        )
    if request.method not in methods and not (request.method == "HEAD" and "GET" in methods):
        response = error_page(request, 405, "Method not allowed", "Use the page's buttons.")
        response["Allow"] = ", ".join(sorted(methods))
        return response
    changes_state = request.method not in SAFE_METHODS
    if (changes_state or form_page) and write is not None and not can(request.user, write):
        return _refusal(request, write)
    if changes_state and write is None:  # defensive: a write view must name its role
        return _refusal(request, Role.ADMIN)
    return None


def ui_view(
    *, methods: Collection[str] = ("GET",), write: Role | None = None, form_page: bool = False
) -> Callable[[View], View]:
    """Guard a UI view.

    ``write`` is the role any non-GET request needs; with ``form_page`` the GET (a form that
    only serves that write) needs it too. Anonymous visitors go to the login page.
    """

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            refused = _gate(request, methods, write, form_page)
            if refused is not None:
                return refused
            try:
                return view(request, *args, **kwargs)
            except (Http404, NotFound) as exc:
                return error_page(request, 404, "Not found", _detail(exc))
            except PermissionDenied:
                return _refusal(request, write or Role.ADMIN)
            except Exception:
                if settings.DEBUG:
                    raise
                signals.got_request_exception.send(sender=None, request=request)
                logger.exception("UI view %s failed", view.__name__)
                return server_error_page(request)

        GUARDED[wrapper] = Guard(frozenset(methods), write, form_page)
        return wrapper

    return decorate


def _detail(exc: Exception) -> str:
    return str(getattr(exc, "detail", "") or exc) or "There is nothing at this address."
