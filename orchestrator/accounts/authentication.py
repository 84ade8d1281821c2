"""``Authorization: Bearer lw_<prefix>_<secret>`` authentication for DRF."""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from orchestrator.accounts.services import api_token_resolve


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer":
            return None
        raw = raw.strip()
        if not raw:
            raise exceptions.AuthenticationFailed("Empty bearer token.")
        token = api_token_resolve(raw)
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked API token.")
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="loopwright"'
