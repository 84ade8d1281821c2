"""Checks a profile publish must pass, registered by the apps that use profiles.

The harness must not import the apps above it (``loops`` owns the patterns that follow a
profile's tag), so those apps register a check here in their ``AppConfig.ready``; the publish
service runs every registered check inside its transaction, after the draft became the current
version and before it commits. A check that refuses raises a :class:`~orchestrator.errors.
DomainError` (the registration check raises a 409 naming the patterns, roles and tools), and the
transaction rolls the publish back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class PublishedVersion:
    """What a publish check sees: the profile's tag and the number being published (already
    the current version inside the publish transaction)."""

    tag: str
    version: int


PublishCheck = Callable[[PublishedVersion], None]

_CHECKS: list[PublishCheck] = []


def publish_check_register(check: PublishCheck) -> None:
    """Run ``check`` on every publish (idempotent: registering it again changes nothing)."""
    if check not in _CHECKS:
        _CHECKS.append(check)


def publish_checks() -> tuple[PublishCheck, ...]:
    return tuple(_CHECKS)


def publish_checks_run(published: PublishedVersion) -> None:
    """Run the registered checks; the first refusal propagates (and rolls the publish back)."""
    for check in publish_checks():
        check(published)
