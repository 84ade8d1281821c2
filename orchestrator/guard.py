"""Django's side of the outbound guard and the secret rule (docs/security.md).

The rules live in ``runtime.outbound`` and ``runtime.secrets`` (no
Django there); this module feeds them the settings: the process-wide outbound policy (the
private-range mode and the server's own database and Redis/broker as never-targets), the
secret rule, Git import's policy, and the save-time checks of a model endpoint. ``apply`` runs
when the app is ready and again whenever a test overrides one of these settings.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from runtime import outbound, secrets
from runtime.outbound import OutboundPolicy, OutboundRefused

#: Settings whose change rebuilds the policy and the rule.
_WATCHED = frozenset(
    {"LOOPWRIGHT_OUTBOUND", "LOOPWRIGHT_SECRETS", "DATABASES", "CELERY_BROKER_URL", "REDIS_URL"}
)


def _database_service() -> outbound.Service | None:
    db: dict[str, Any] = settings.DATABASES["default"]
    if "postgresql" not in db.get("ENGINE", ""):
        return None
    host = str(db.get("HOST") or "localhost")
    if host.startswith("/"):
        return None  # a Unix socket directory
    return outbound.service_at("DATABASE_URL", host.lower(), int(db.get("PORT") or 5432))


def policy_from_settings() -> OutboundPolicy:
    """The outbound policy the settings configure, with the backing services resolved now."""
    services = [_database_service()]
    services += [
        outbound.service(name, getattr(settings, name, "") or "")
        for name in ("CELERY_BROKER_URL", "REDIS_URL")
    ]
    return OutboundPolicy(
        private=settings.LOOPWRIGHT_OUTBOUND["PRIVATE"],
        services=tuple(found for found in services if found is not None),
    )


def secret_rule() -> secrets.SecretRule:
    rule: secrets.SecretRule = settings.LOOPWRIGHT_SECRETS
    return rule


def apply() -> None:
    """Make the settings' policy (built on first use) and secret rule the process-wide ones."""
    outbound.configure(policy_from_settings)
    secrets.configure_secret_rule(secret_rule())


@receiver(setting_changed)
def _reapply(*, setting: str, **_: Any) -> None:
    if setting in _WATCHED:
        apply()


def git_policy() -> OutboundPolicy:
    """Git import's policy: the process-wide one with ``LOOPWRIGHT_GIT_SCHEMES``."""
    schemes = settings.LOOPWRIGHT_OUTBOUND["GIT_SCHEMES"]
    return outbound.current_policy().with_schemes(schemes)


def endpoint_problems(*, provider: str, base_url: str, api_key_env: str) -> dict[str, str]:
    """Field → refusal for a model endpoint about to be saved: the secret rule on
    ``api_key_env``, and the outbound guard on ``base_url`` (scheme, literal addresses,
    metadata names, and the addresses a name resolves to now)."""
    problems: dict[str, str] = {}
    refusal = secret_rule().check(api_key_env)
    if refusal is not None:
        problems["api_key_env"] = refusal
    if provider != "scripted" and base_url:
        problem = outbound_url_problem(base_url)
        if problem:
            problems["base_url"] = f"base_url {problem}"
    return problems


def outbound_url_problem(url: str) -> str:
    """Why the outbound guard refuses ``url`` now ("refused: ..."), or "" (scheme, literal
    addresses, metadata names, and the addresses a name resolves to now)."""
    try:
        outbound.check_url_now(url, outbound.current_policy())
    except OutboundRefused as exc:
        return f"refused: {exc}"
    return ""
