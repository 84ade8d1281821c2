"""Creating and changing loop patterns, with every rule checked before anything is written."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.db import transaction
from django.db.models import F, Max, Q
from django.utils import timezone

from harness.autonomy import ALLOWLISTED, UngatedTool, ungated_tools
from harness.checks import PublishedVersion
from harness.models import HarnessProfileVersion, VersionStatus
from harness.planner import plan_tools
from harness.services import HarnessCompilation, harness_compile_for, harness_tag_exists
from loops.cron import CronInvalid, CronSpec, cron_validate
from loops.models import AutonomyLevel, LoopPattern, TriggerType
from loops.policy import PatternPolicy, parse_policy
from loops.services.schedules import cron_schedule_sync
from loops.services.semantic_cache import semantic_cache_errors
from loops.templates import check_template
from orchestrator.agents.models import Employee
from orchestrator.errors import Conflict, InvalidInput
from runtime.tools.registry import provider_review_gates
from runtime.tools.specs import tool_spec
from runtime.types import Effect, ToolSpec

PATTERN_FIELDS = (
    "title", "description", "goal_template", "autonomy_level", "trigger_type", "cron_expression",
    "timezone", "missed_fire_policy", "event_key", "leader_username", "maker_usernames",
    "verifier_username", "leader_harness_tag", "maker_harness_tag", "verifier_harness_tag",
    "repository_key", "repository_root", "base_ref", "acting_on", "policy", "enabled",
    "a2a_enabled",
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
        zone_ok = _valid_timezone(p.timezone)
        if not zone_ok:
            errors.append(
                _err("/timezone", f"Unknown time zone {p.timezone!r}.", "invalid_timezone")
            )
        if not p.cron_expression:
            errors.append(
                _err("/cron_expression", "A cron pattern needs a cron expression.", "required")
            )
        else:
            tz = p.timezone if zone_ok and p.timezone else "UTC"
            try:
                cron_validate(CronSpec(p.cron_expression, tz, hash_id=p.key), now=timezone.now())
            except CronInvalid as exc:
                errors.append(_err("/cron_expression", str(exc), "invalid_cron"))
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


# --- The registration check (seed 004): write and high-risk tools need a human gate -----------

REPOSITORY_FIELDS = ("repository_key", "repository_root", "base_ref")
_HINTS = {
    ("L1", Effect.WRITE): "autonomy L2",
    ("L1", Effect.EXTERNAL): "autonomy L3",
    ("L2", Effect.EXTERNAL): "autonomy L3",
}


@dataclass(frozen=True)
class RoleBinding:
    """One role of a pattern: which employee runs it under which harness tag."""

    role: str  # leader | maker | verifier
    username: str
    tag_field: str  # the pattern field naming its harness tag

    def tag(self, pattern: LoopPattern) -> str:
        return str(getattr(pattern, self.tag_field))

    @property
    def name(self) -> str:
        return f"{self.role} {self.username!r}"

    def named(self) -> dict[str, str]:
        return {"role": self.role, "employee": self.username}


def role_bindings(pattern: LoopPattern) -> list[RoleBinding]:
    roles = [RoleBinding("leader", pattern.leader_username, "leader_harness_tag")]
    roles += [RoleBinding("maker", m, "maker_harness_tag") for m in pattern.maker_usernames or []]
    roles.append(RoleBinding("verifier", pattern.verifier_username, "verifier_harness_tag"))
    return roles


@dataclass(frozen=True)
class EmployeeTools:
    """What the registration check needs of an employee: the specs of the tools it binds
    (names no registry knows are left out: the runtime denies them) and its own harness layers."""

    specs: tuple[ToolSpec, ...] = ()
    harness_tag: str = ""
    harness: dict[str, Any] | None = None


def _employee_of(username: str) -> EmployeeTools:
    employee = Employee.objects.filter(username=username).first()
    if employee is None:
        return EmployeeTools()
    specs = [spec for name in employee.tools or [] if (spec := tool_spec(str(name))) is not None]
    return EmployeeTools(tuple(specs), employee.harness_tag, dict(employee.harness or {}) or None)


def _compile_role(
    pattern: LoopPattern,
    policy: PatternPolicy,
    binding: RoleBinding,
    pins: Mapping[str, str] | None = None,
) -> tuple[HarnessCompilation, list[ToolSpec]]:
    """The role's harness as a run would compile it (without run overrides, which only
    tighten). ``pins`` replaces profile references (``{"tag": "tag@2"}``)."""
    pins = pins or {}
    employee = _employee_of(binding.username)
    tag = binding.tag(pattern)
    compilation = harness_compile_for(
        tag=pins.get(tag, tag),
        pattern_layer=policy.harness or None,
        employee_username=binding.username,
        employee_profile=pins.get(employee.harness_tag, employee.harness_tag) or None,
        employee_layer=employee.harness,
    )
    specs = list(employee.specs)
    if binding.role == "leader":  # the leader only ever gets read tools
        specs = [s for s in specs if s.effect == Effect.READ]
    return compilation, specs


def _ungated_detail(
    pattern: LoopPattern, binding: RoleBinding, found: UngatedTool, source: str, by: str
) -> str:
    why = (
        "the pattern's approvals.autoAllowlist waives its approval"
        if source == ALLOWLISTED
        else f"tools.trustedPreHandlerTools trusts it (set by {by})"
    )
    hint = _HINTS.get((found.level, found.effect))
    fix = "gate it (tools.ask), remove the trust or the allowlist entry"
    fix += f", or use {hint}" if hint else ""
    return (
        f"Tool {found.name!r} ({found.tier} tier) of {binding.name} would run without a human "
        f"gate: {why}; {found.reason} ({pattern.autonomy_level}). To save, {fix}."
    )


def _role_check(
    pattern: LoopPattern,
    policy: PatternPolicy,
    binding: RoleBinding,
    pins: Mapping[str, str] | None = None,
) -> list[dict[str, str]]:
    """The registration check of one role: its ungated tools the autonomy level forbids, and a
    worktree its harness requires without a repository."""
    try:
        compilation, specs = _compile_role(pattern, policy, binding, pins)
    except InvalidInput as exc:
        return _layer_errors(exc, binding, binding.tag(pattern))
    compiled = compilation.compiled
    plan = plan_tools(compiled, specs)
    allowlist = list(policy.approvals.autoAllowlist)
    review = provider_review_gates(plan.decisions())
    errors = []
    for found in ungated_tools(plan, pattern.autonomy_level, auto_allowlist=allowlist,
                               review_gated=review):  # fmt: skip
        for source in found.sources:
            pointer = (
                f"/policy/approvals/autoAllowlist/{allowlist.index(found.name)}"
                if source == ALLOWLISTED
                else f"/{binding.tag_field}"
            )
            by = compiled.provenance.get("tools.trustedPreHandlerTools", "the profile")
            detail = _ungated_detail(pattern, binding, found, source, by)
            error = _err(pointer, detail, "autonomy_needs_gate")
            errors.append({**error, **binding.named(), "tool": found.name, "tier": found.tier})
    return errors + _worktree_errors(pattern, binding, compilation)


def _worktree_errors(
    pattern: LoopPattern, binding: RoleBinding, compilation: HarnessCompilation
) -> list[dict[str, str]]:
    values, provenance = compilation.compiled.values, compilation.compiled.provenance
    if values["isolation.mode"] == "worktree":
        why = f"isolation.mode = worktree (set by {provenance['isolation.mode']})"
    elif values["isolation.requireWorktree"]:
        why = f"isolation.requireWorktree (set by {provenance['isolation.requireWorktree']})"
    else:
        return []
    return [
        {
            **_err(
                f"/{field}",
                f"The harness of {binding.name} requires a worktree, {why}; a worktree needs "
                f"the pattern's repository ({field}).",
                "worktree_needs_repository",
            ),
            **binding.named(),
        }
        for field in REPOSITORY_FIELDS
        if not getattr(pattern, field)
    ]


def _layer_errors(exc: InvalidInput, binding: RoleBinding, tag: str) -> list[dict[str, str]]:
    """A layer the compiler refused, pointed at the pattern's fields (a profile the role's tag
    does not name is the employee's own)."""
    errors = []
    unnamed = "" if tag in exc.detail else "/employee/harness_tag"
    for error in exc.extra.get("errors") or [{"pointer": unnamed, "detail": exc.detail}]:
        pointer = str(error.get("pointer", ""))
        if pointer.startswith("/pattern"):
            pointer = "/policy/harness" + pointer[len("/pattern") :]
        elif pointer.startswith("/employee"):
            detail = f"The harness of employee {binding.username!r}: {error.get('detail')}"
            error = {**error, "detail": detail}
            pointer = "/maker_usernames" if binding.role == "maker" else f"/{binding.role}_username"
        else:
            pointer = f"/{binding.tag_field}"
        errors.append(_err(pointer, str(error.get("detail")), str(error.get("code", "invalid"))))
    return errors


def registration_errors(pattern: LoopPattern, policy: PatternPolicy) -> list[dict[str, str]]:
    """Every role's registration check (roles whose harness tag is unknown are skipped: that
    is reported on its own). Errors at one pointer with one detail are listed once."""
    errors: list[dict[str, str]] = []
    for binding in role_bindings(pattern):
        if binding.username and harness_tag_exists(binding.tag(pattern)):
            errors.extend(e for e in _role_check(pattern, policy, binding) if e not in errors)
    return errors


def _without_repeats(errors: list[dict[str, str]]) -> list[dict[str, str]]:
    """A missing repository field reported by the autonomy rule is not reported again."""
    seen: set[str] = set()
    kept = []
    for error in errors:
        if error["code"] == "worktree_needs_repository" and error["pointer"] in seen:
            continue
        seen.add(error["pointer"])
        kept.append(error)
    return kept


def pattern_validate(pattern: LoopPattern) -> None:
    """Raise InvalidInput listing every rule the pattern breaks."""
    policy = parse_policy(pattern.policy)
    check_template(pattern.goal_template)
    errors = [
        *_role_errors(pattern),
        *_autonomy_errors(pattern, policy.model_dump()),
        *_trigger_errors(pattern),
        *_harness_errors(pattern),
        *semantic_cache_errors(policy),
    ]
    errors = _without_repeats([*errors, *registration_errors(pattern, policy)])
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
    """Apply changes, validate the result, bump the version (runs pin the version they used).
    Values equal to the current ones are no change: when nothing changes, nothing is written."""
    locked = LoopPattern.objects.select_for_update().get(pk=pattern.pk)
    changed = {
        name: value
        for name, value in fields.items()
        if name in PATTERN_FIELDS and getattr(locked, name) != value
    }
    if not changed:
        return locked
    for name, value in changed.items():
        setattr(locked, name, value)
    pattern_validate(locked)
    locked.version = F("version") + 1
    locked.save()
    locked.refresh_from_db()
    cron_schedule_sync(locked)
    return locked


# --- Publishing a profile: the patterns that follow its tag must still pass ------------------

#: Where in the published settings each kind of refusal comes from.
_PUBLISH_POINTERS = {
    "autonomy_needs_gate": "/settings/tools",
    "worktree_needs_repository": "/settings/isolation",
}


def _key(error: dict[str, str]) -> tuple[str, ...]:
    """What identifies a refusal across profile versions (its detail names the version)."""
    return tuple(error.get(k, "") for k in ("pointer", "code", "role", "employee", "tool"))


def _previous_published(tag: str, version: int) -> int | None:
    found = HarnessProfileVersion.objects.filter(
        profile__tag=tag, status=VersionStatus.PUBLISHED, version__lt=version
    ).aggregate(previous=Max("version"))["previous"]
    return int(found) if found is not None else None


def _publish_refusals(
    pattern: LoopPattern, published: PublishedVersion, pins: Mapping[str, str], followers: set[str]
) -> list[dict[str, str]]:
    try:
        policy = parse_policy(pattern.policy)
    except InvalidInput:
        return []  # a stored policy the schema refuses fails at trigger time, not here
    refusals = []
    for binding in role_bindings(pattern):
        if binding.tag(pattern) != published.tag and binding.username not in followers:
            continue
        now = _role_check(pattern, policy, binding) if binding.username else []
        before = {_key(e) for e in _role_check(pattern, policy, binding, pins)} if now else set()
        for error in now:
            if error["code"] in _PUBLISH_POINTERS and (not pins or _key(error) not in before):
                pointer = _PUBLISH_POINTERS[error["code"]]
                if error["pointer"] == f"/{binding.tag_field}":  # trusted by the profile
                    pointer = "/settings/tools/trustedPreHandlerTools"
                where = {"pattern": pattern.key, "field": error["pointer"]}
                refusals.append({**error, "pointer": pointer, **where})
    return refusals


def profile_publish_check(published: PublishedVersion) -> None:
    """Refuse (409) a publish that would make a pattern following the tag break its
    registration check: a write or high-risk tool left without a human gate where the pattern's
    autonomy level forbids it, or a worktree required of a pattern without a repository.

    A role follows the tag when its harness tag is ``tag`` or its employee carries ``tag``
    (``tag@N`` is pinned: unaffected). Only refusals the previous version did not already cause
    count, so fixing one problem is never blocked by another that was there before. Registered
    in ``LoopsConfig.ready`` through ``harness.checks``."""
    tag = published.tag
    followers = set(Employee.objects.filter(harness_tag=tag).values_list("username", flat=True))
    candidates = LoopPattern.objects.order_by("key")
    if not followers:
        candidates = candidates.filter(
            Q(leader_harness_tag=tag) | Q(maker_harness_tag=tag) | Q(verifier_harness_tag=tag)
        )
    previous = _previous_published(tag, published.version)
    pins = {tag: f"{tag}@{previous}"} if previous is not None else {}
    refusals = [e for p in candidates for e in _publish_refusals(p, published, pins, followers)]
    if not refusals:
        return
    keys = sorted({e["pattern"] for e in refusals})
    first = refusals[0]
    raise Conflict(
        f"Publishing version {published.version} of {tag!r} is refused: {len(refusals)} "
        f"problem(s) in pattern(s) {', '.join(keys)}. First: pattern {first['pattern']!r}: "
        f"{first['detail']}",
        errors=refusals,
        patterns=keys,
    )
