"""``Authorization: Bearer lw_<prefix>_<secret>`` authentication for DRF.

A request without an ``Authorization`` header is left to the next class (the session); one with
a header is this class's to accept or to refuse with a 401 saying what is wrong
(:func:`orchestrator.accounts.services.api_token_authenticate`).
"""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from orchestrator.accounts.services import TokenRefused, api_token_authenticate


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header.strip():
            return None
        try:
            token = api_token_authenticate(header)
        except TokenRefused as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="loopwright"'
