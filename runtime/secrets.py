"""API keys: read from the environment at call time, and kept out of every text we produce.

An endpoint names the *environment variable* that holds its key (``api_key_env``); the key
itself is never stored, never returned and never formatted. :class:`Secret` wraps the value so
that an accidental ``repr()``, f-string or log argument prints a mask, and :func:`redact` scrubs
the value from provider text (error bodies often echo the key back) before that text reaches an
exception or a log line.

Which variables may be named at all is one rule, :func:`check_secret_name`, used at save time
(REST, admin) and at call time (the model client reads nothing else), and by every later
connector: a name under the configured prefix (``LOOPWRIGHT_SECRET_PREFIX``, default
``LOOPWRIGHT_SECRET_``) or listed by the admin (``LOOPWRIGHT_SECRET_ALLOW``), and never a
variable the server reads for its own configuration (:data:`SERVER_VARIABLES`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MASK = "***"
DEFAULT_PREFIX = "LOOPWRIGHT_SECRET_"
PREFIX_SETTING = "LOOPWRIGHT_SECRET_PREFIX"
ALLOW_SETTING = "LOOPWRIGHT_SECRET_ALLOW"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: Variables of the server's own configuration and process: never a connector's secret, even
#: under the prefix or on the allow list (the allow list may not name them; startup refuses).
SERVER_VARIABLES = frozenset(
    {
        # orchestrator/settings.py
        "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS", "DATABASE_URL",
        "DB_CONN_MAX_AGE", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "REDIS_URL",
        "EMAIL_HOST", "EMAIL_PORT", "EMAIL_HOST_USER", "EMAIL_HOST_PASSWORD", "EMAIL_USE_TLS",
        "DEFAULT_FROM_EMAIL", "LOG_LEVEL", "DJANGO_SETTINGS_MODULE", "DJANGO_ALLOW_ASYNC_UNSAFE",
        PREFIX_SETTING, ALLOW_SETTING, "LOOPWRIGHT_TOKEN", "LOOPWRIGHT_URL",
        # the process
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "TMPDIR", "LANG", "TERM", "HOSTNAME",
        "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LD_PRELOAD", "LD_LIBRARY_PATH", "SSH_AUTH_SOCK",
        "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
        "all_proxy", "no_proxy", "PGPASSWORD", "PGPASSFILE", "REDISCLI_AUTH",
    }
)  # fmt: skip
#: Every ``LOOPWRIGHT_*`` variable is the server's own, except those under the secret prefix.
SERVER_PREFIX = "LOOPWRIGHT_"


class SecretNotAllowed(ValueError):
    """A connector names a variable the secret rule does not allow; the message says why."""


def is_server_variable(name: str, prefix: str = DEFAULT_PREFIX) -> bool:
    """Whether ``name`` belongs to the server's own configuration or process."""
    if name in SERVER_VARIABLES:
        return True
    return name.startswith(SERVER_PREFIX) and not name.startswith(prefix)


def check_secret_name(
    name: str, prefix: str, allow: Iterable[str], *, field: str = "api_key_env"
) -> str | None:
    """None when a connector may name ``name`` as its secret (or ``name`` is empty: no secret);
    otherwise the refusal, with the rule in it. Pure: settings come in as arguments."""
    if not name:
        return None
    if not ENV_NAME.match(name):
        return f"{field} must be an environment variable name (letters, digits, _); got {name!r}"
    allowed = frozenset(allow)
    rule = f"{field} must name a variable starting with {prefix} or listed in {ALLOW_SETTING}"
    if is_server_variable(name, prefix):
        if name.startswith(prefix) or name in allowed:
            return f"{rule}, and never one of the server's own; {name} is the server's own"
        return f"{rule}; {name} is neither (it is one of the server's own variables)"
    if (name.startswith(prefix) and len(name) > len(prefix)) or name in allowed:
        return None
    return f"{rule}; {name} is neither"


@dataclass(frozen=True)
class SecretRule:
    """The configured prefix and allow list (:func:`parse_secret_rule` validates them)."""

    prefix: str = DEFAULT_PREFIX
    allow: frozenset[str] = frozenset()

    def check(self, name: str, *, field: str = "api_key_env") -> str | None:
        return check_secret_name(name, self.prefix, self.allow, field=field)


def parse_secret_rule(prefix: str | None, allow: str | None) -> SecretRule:
    """The rule from the settings' text (``None``/empty prefix: the default); ValueError with
    an operator's message for a prefix or an allow list that would expose server settings."""
    chosen = (prefix or "").strip() or DEFAULT_PREFIX
    if not ENV_NAME.match(chosen) or len(chosen) < 4:
        raise ValueError(
            f"{PREFIX_SETTING} must be a variable-name prefix of at least 4 characters "
            f"(letters, digits, _), such as {DEFAULT_PREFIX}; got {prefix!r}"
        )
    exposed = sorted(
        name for name in SERVER_VARIABLES | {"LOOPWRIGHT_VAR_DIR", "LOOPWRIGHT_PUBLIC_URL"}
        if name.startswith(chosen) and name not in (PREFIX_SETTING, ALLOW_SETTING)
    )  # fmt: skip
    if exposed or chosen in (SERVER_PREFIX, "LOOPWRIGHT"):
        raise ValueError(
            f"{PREFIX_SETTING}={chosen} would cover server settings "
            f"({', '.join(exposed) or 'LOOPWRIGHT_*'}); choose a narrower prefix"
        )
    names = [n.strip() for n in (allow or "").split(",") if n.strip()]
    bad = [n for n in names if not ENV_NAME.match(n)]
    if bad:
        raise ValueError(f"{ALLOW_SETTING} lists names that are not variable names: {bad}")
    server = [n for n in names if is_server_variable(n, chosen)]
    if server:
        raise ValueError(f"{ALLOW_SETTING} may not list server settings: {', '.join(server)}")
    return SecretRule(chosen, frozenset(names))


def secret_rule_from_environ(environ: Mapping[str, str] | None = None) -> SecretRule:
    env = os.environ if environ is None else environ
    return parse_secret_rule(env.get(PREFIX_SETTING), env.get(ALLOW_SETTING))


_configured: SecretRule | None = None


def configure_secret_rule(rule: SecretRule | None) -> None:
    """Set the process-wide rule (Django does it from its settings); None: from the
    environment on next use."""
    global _configured
    _configured = rule


def current_secret_rule() -> SecretRule:
    global _configured
    if _configured is None:
        _configured = secret_rule_from_environ()
    return _configured


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


def api_key_from_env(
    env_name: str, environ: Mapping[str, str] | None = None, *, rule: SecretRule | None = None
) -> Secret | None:
    """The key held by ``env_name`` right now, or None when the name is empty or unset.
    Raises :class:`SecretNotAllowed` (before reading anything) for a name the rule refuses."""
    if not env_name:
        return None
    problem = (rule or current_secret_rule()).check(env_name)
    if problem is not None:
        raise SecretNotAllowed(problem)
    value = (os.environ if environ is None else environ).get(env_name, "")
    return Secret(value) if value else None


def api_key_configured(
    env_name: str, environ: Mapping[str, str] | None = None, *, rule: SecretRule | None = None
) -> bool:
    """Whether the variable is allowed and set (a refused name is never read, so: False)."""
    try:
        return api_key_from_env(env_name, environ, rule=rule) is not None
    except SecretNotAllowed:
        return False


def redact(text: str, *secrets: Secret | None) -> str:
    """``text`` with every given secret, and anything shaped like a bearer token, masked."""
    for secret in secrets:
        if secret is not None and secret.reveal():
            text = text.replace(secret.reveal(), MASK)
    return _BEARER.sub(lambda m: m.group(1) + MASK, text)
