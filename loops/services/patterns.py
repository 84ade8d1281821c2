"""Creating and changing loop patterns, with every rule checked before anything is written."""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from django.db import transaction
from django.db.models import F

from harness.services import harness_tag_exists
from loops.models import AutonomyLevel, LoopPattern, TriggerType
from loops.policy import parse_policy
from loops.services.schedules import cron_schedule_sync
from loops.templates import check_template
from orchestrator.errors import InvalidInput

PATTERN_FIELDS = (
    "title", "description", "goal_template", "autonomy_level", "trigger_type", "cron_expression",
    "timezone", "missed_fire_policy", "event_key", "leader_username", "maker_usernames",
    "verifier_username", "leader_harness_tag", "maker_harness_tag", "verifier_harness_tag",
    "repository_key", "repository_root", "base_ref", "acting_on", "policy", "enabled",
)  # fmt: skip


def _err(pointer: str, detail: str, code: str = "invalid") -> dict[str, str]:
    return {"pointer": pointer, "detail": detail, "code": code}


def _role_errors(p: LoopPattern) -> list[dict[str, str]]:
    errors = []
    makers = list(p.maker_usernames or [])
    if p.verifier_username and p.verifier_username == p.leader_username:
        errors.append(
            _err(
                "/verifier_username",
                "The verifier must differ from the leader.",
                "verifier_not_independent",
            )
        )
    if p.verifier_username and p.verifier_username in makers:
        errors.append(
            _err(
                "/verifier_username",
                "The verifier must differ from every maker.",
                "verifier_not_independent",
            )
        )
    if len(set(makers)) != len(makers):
        errors.append(_err("/maker_usernames", "Makers must be distinct.", "duplicate"))
    return errors


def _autonomy_errors(p: LoopPattern, policy: dict[str, Any]) -> list[dict[str, str]]:
    if p.autonomy_level == AutonomyLevel.L1:
        return []
    errors = []
    for name in ("repository_key", "repository_root", "base_ref"):
        if not getattr(p, name):
            errors.append(
                _err(
                    f"/{name}",
                    f"{p.autonomy_level} patterns need a repository identity ({name}).",
                    "required",
                )
            )
    if not p.acting_on:
        errors.append(
            _err(
                "/acting_on",
                f"{p.autonomy_level} patterns must name the paths they act on.",
                "required",
            )
        )
    isolation = (policy.get("harness") or {}).get("isolation") or {}
    if not isolation.get("requireWorktree"):
        errors.append(
            _err(
                "/policy/harness/isolation/requireWorktree",
                f"{p.autonomy_level} patterns require worktree isolation.",
                "required",
            )
        )
    return errors


def _trigger_errors(p: LoopPattern) -> list[dict[str, str]]:
    errors = []
    if p.trigger_type == TriggerType.CRON:
        # H fields are seeded by the pattern key, exactly as the scheduler evaluates them.
        hash_id = p.key.encode("utf-8") if p.key else None
        if not p.cron_expression or not croniter.is_valid(p.cron_expression, hash_id=hash_id):
            errors.append(
                _err(
                    "/cron_expression",
                    "A cron pattern needs a valid cron expression.",
                    "invalid_cron",
                )
            )
        if not _valid_timezone(p.timezone):
            errors.append(
                _err("/timezone", f"Unknown time zone {p.timezone!r}.", "invalid_timezone")
            )
    if p.trigger_type == TriggerType.EVENT and not p.event_key:
        errors.append(_err("/event_key", "An event pattern needs an event key.", "required"))
    return errors


def _valid_timezone(name: str) -> bool:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


def _harness_errors(p: LoopPattern) -> list[dict[str, str]]:
    errors = []
    for field in ("leader_harness_tag", "maker_harness_tag", "verifier_harness_tag"):
        tag = getattr(p, field)
        if not harness_tag_exists(tag):
            errors.append(
                _err(f"/{field}", f"No published harness profile {tag!r}.", "unknown_harness")
            )
    return errors


def pattern_validate(pattern: LoopPattern) -> None:
    """Raise InvalidInput listing every rule the pattern breaks."""
    policy = parse_policy(pattern.policy)
    check_template(pattern.goal_template)
    errors = [
        *_role_errors(pattern),
        *_autonomy_errors(pattern, policy.model_dump()),
        *_trigger_errors(pattern),
        *_harness_errors(pattern),
    ]
    if errors:
        raise InvalidInput(
            errors[0]["detail"] if len(errors) == 1 else f"{len(errors)} fields are invalid.",
            errors=errors,
        )
    pattern.max_concurrency = policy.concurrency


@transaction.atomic
def pattern_create(*, key: str, actor: str, **fields: Any) -> LoopPattern:
    if LoopPattern.objects.filter(key=key).exists():
        raise InvalidInput(
            f"A pattern with key {key!r} already exists.",
            errors=[_err("/key", "already exists", "unique")],
        )
    pattern = LoopPattern(
        key=key, created_by=actor, **{k: v for k, v in fields.items() if k in PATTERN_FIELDS}
    )
    pattern_validate(pattern)
    pattern.save()
    cron_schedule_sync(pattern)
    return pattern


@transaction.atomic
def pattern_update(*, pattern: LoopPattern, **fields: Any) -> LoopPattern:
    """Apply changes, validate the result, bump the version (runs pin the version they used)."""
    locked = LoopPattern.objects.select_for_update().get(pk=pattern.pk)
    for name, value in fields.items():
        if name in PATTERN_FIELDS:
            setattr(locked, name, value)
    pattern_validate(locked)
    locked.version = F("version") + 1
    locked.save()
    locked.refresh_from_db()
    cron_schedule_sync(locked)
    return locked
