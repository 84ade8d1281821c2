"""API keys: read from the environment at call time, and kept out of every text we produce.

An endpoint names the *environment variable* that holds its key (``api_key_env``); the key
itself is never stored, never returned and never formatted. :class:`Secret` wraps the value so
that an accidental ``repr()``, f-string or log argument prints a mask, and :func:`redact` scrubs
the value from provider text (error bodies often echo the key back) before that text reaches an
exception or a log line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

MASK = "***"

# Providers echo credentials in error bodies in these shapes; scrub them even when the echoed
# value is not exactly ours (a proxy in front may have injected its own).
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}")


class Secret:
    """A secret string that refuses to show itself except through :meth:`reveal`."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"

    def __str__(self) -> str:
        return MASK

    def __format__(self, format_spec: str) -> str:
        return MASK

    def __reduce__(self) -> tuple[object, ...]:
        # Pickling would carry the value into Celery results or caches.
        raise TypeError("a Secret cannot be pickled")


def api_key_from_env(env_name: str, environ: Mapping[str, str] | None = None) -> Secret | None:
    """The key held by ``env_name`` right now, or None when the name is empty or unset."""
    if not env_name:
        return None
    value = (os.environ if environ is None else environ).get(env_name, "")
    return Secret(value) if value else None


def api_key_configured(env_name: str, environ: Mapping[str, str] | None = None) -> bool:
    return api_key_from_env(env_name, environ) is not None


def redact(text: str, *secrets: Secret | None) -> str:
    """``text`` with every given secret, and anything shaped like a bearer token, masked."""
    for secret in secrets:
        if secret is not None and secret.reveal():
            text = text.replace(secret.reveal(), MASK)
    return _BEARER.sub(lambda m: m.group(1) + MASK, text)
