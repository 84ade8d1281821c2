"""Who did it: the name an API request's writes are attributed to in events and audit rows."""

from __future__ import annotations

from rest_framework.request import Request


def request_actor(request: Request) -> str:
    """The authenticated user's username, or ``anonymous`` when there is none."""
    return str(getattr(request.user, "username", "") or "anonymous")
