"""Starting runs and the human actions on them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from harness.compile import layer_parse, not_applied
from harness.services import (
    HarnessCompilation,
    harness_compile_for,
    layer_stored,
    profile_versions_current,
)
from loops import state
from loops.models import LoopEvent, LoopPattern, LoopRun, RunStatus, TriggerType
from loops.policy import PatternPolicy, parse_policy
from loops.services.breakers import breaker_admit_trigger, breaker_start_probe
from loops.services.budget_rules import spent_message
from loops.services.budgets import daily_exhaustion
from loops.services.endings import run_transition
from loops.services.nudges import nudge_run
from loops.services.run_employees import RunEmployees, run_employees_read
from loops.services.run_prompts import run_goal, run_instruction_pins
from loops.services.transitions import Lease, run_event_append
from loops.span_models import new_trace_id
from orchestrator import wakeups
from orchestrator.errors import Conflict, invalid_fields
from orchestrator.tracecontext import TRACE_ID
from runtime.invocation import LeaseLost
from runtime.model_images import image_input_problems


def role_bindings_of(pattern: LoopPattern) -> dict[str, Any]:
    return {
        "leader": pattern.leader_username,
        "makers": list(pattern.maker_usernames or []),
        "verifier": pattern.verifier_username,
    }


def role_usernames_of(bindings: dict[str, Any]) -> list[str]:
    """The employees of :func:`role_bindings_of`: leader, makers, verifier."""
    return [bindings["leader"], *bindings["makers"], bindings["verifier"]]


@dataclass(frozen=True)
class RoleHarness:
    """Each role's compiled harness snapshot, and what the run's overrides asked for that an
    earlier layer did not allow (``[{role, employee, field, asked, got, decidedBy}]``)."""

    snapshots: dict[str, Any]
    notices: list[dict[str, Any]]


def harness_overrides_validated(data: Any) -> dict[str, Any] | None:
    """A run's harness overrides as the run layer stores them, or None for none (absent or
    ``{}``). InvalidInput with pointers ``/harness_overrides/<section>/<key>`` otherwise."""
    if data is None:
        return None
    return layer_stored(data, "harness_overrides", "harness overrides") or None


def role_harness_compile(
    pattern: LoopPattern,
    policy: PatternPolicy,
    overrides: dict[str, Any] | None,
    employees: RunEmployees | None = None,
) -> RoleHarness:
    """Compile each role's harness now: platform → the role's profile → the pattern's layer →
    the employee's profile and inline layers (if any) → the run's overrides (validated, see
    :func:`harness_overrides_validated`). The run keeps the snapshots for its whole life; the
    harness preview API answers exactly these.

    Roles whose employee carries no layer of its own differ only in their profile, so each
    such profile is compiled once and every role of it gets its own copy. The profiles of all
    the roles and employees are read in one query; ``employees`` (read here when None) is
    :func:`run_employees_read` of the roles' employees."""
    overrides = harness_overrides_validated(overrides)
    run_layer = layer_parse("run", overrides) if overrides else None
    bindings = role_bindings_of(pattern)
    if employees is None:
        employees = run_employees_read(role_usernames_of(bindings))
    layers = employees.layers
    tags = [pattern.leader_harness_tag, pattern.maker_harness_tag, pattern.verifier_harness_tag]
    versions = profile_versions_current([*tags, *(tag for tag, _ in layers.values())])
    compiled: dict[tuple[str, str | None], HarnessCompilation] = {}
    notices: list[dict[str, Any]] = []

    def compile_for(role: str, tag: str, employee: str) -> dict[str, Any]:
        own_tag, own_layer = layers.get(employee, ("", {}))
        key = (tag, employee if employee in layers else None)
        if key not in compiled:
            compiled[key] = harness_compile_for(
                tag=tag,
                pattern_layer=policy.harness or None,
                employee_username=employee,
                employee_profile=own_tag or None,
                employee_layer=own_layer or None,
                run_overrides=overrides,
                versions=versions,
            )
        compilation = compiled[key]
        if run_layer is not None:
            found = not_applied(compilation.compiled, run_layer)
            notices.extend({"role": role, "employee": employee, **n} for n in found)
        return compilation.snapshot()  # fresh data: no two roles share a dict

    snapshots = {
        "leader": compile_for("leader", pattern.leader_harness_tag, bindings["leader"]),
        "makers": {
            maker: compile_for("maker", pattern.maker_harness_tag, maker)
            for maker in bindings["makers"]
        },
        "verifier": compile_for("verifier", pattern.verifier_harness_tag, bindings["verifier"]),
    }
    return RoleHarness(snapshots, notices)


def role_harness_snapshots(
    pattern: LoopPattern, policy: PatternPolicy, overrides: dict[str, Any] | None
) -> dict[str, Any]:
    """The snapshots of :func:`role_harness_compile`."""
    return role_harness_compile(pattern, policy, overrides).snapshots


def repository_snapshot_of(pattern: LoopPattern) -> dict[str, Any]:
    return {
        "repositoryKey": pattern.repository_key,
        "repositoryRoot": pattern.repository_root,
        "baseRef": pattern.base_ref,
        "actingOn": list(pattern.acting_on or []),
    }


@transaction.atomic
def run_trigger(
    *,
    pattern: LoopPattern,
    actor: str,
    inputs: dict[str, Any] | None = None,
    trigger_type: str = TriggerType.MANUAL,
    trigger_ref: str = "",
    event: dict[str, Any] | None = None,
    harness_overrides: dict[str, Any] | None = None,
    retry_of: LoopRun | None = None,
) -> LoopRun:
    """Create a queued run with its snapshots and first event, then nudge a worker.

    The single entry point of manual, retry, cron and event triggers, so every one of them is
    refused (409) the same way: a disabled pattern, a spent daily budget, an open circuit
    breaker (``breaker_open_until``). When the breaker's cooldown is over, the run started here
    is its half-open probe (the breaker row stays locked until this transaction commits).

    ``harness_overrides`` is the run's own harness layer (stacked last; it can only tighten).
    What it asked for that an earlier layer did not allow is listed in the ``run.created``
    event (``overrides_not_applied``) and on the returned run (``harness_notices``).
    """
    if not pattern.enabled:
        raise Conflict(f"Pattern {pattern.key!r} is disabled; enable it to start runs.")
    inputs = dict(inputs or {})
    if problems := image_input_problems(inputs):
        raise invalid_fields(problems)
    policy = parse_policy(pattern.policy)
    overrides = harness_overrides_validated(harness_overrides)
    bindings = role_bindings_of(pattern)
    employees = run_employees_read(role_usernames_of(bindings))
    harness = role_harness_compile(pattern, policy, overrides, employees)
    _refuse_when_spent(pattern)
    probe = breaker_admit_trigger(pattern)
    pins = run_instruction_pins(pattern, employees.prompts, retry_of)
    goal = run_goal(
        pattern,
        {
            "inputs": inputs,
            "event": event or {},
            "pattern": {"key": pattern.key, "title": pattern.title},
        },
        pins,
    )
    run = LoopRun.objects.create(
        pattern=pattern,
        pattern_version=pattern.version,
        status=RunStatus.QUEUED,
        trigger_type=trigger_type,
        triggered_by=actor,
        trigger_ref=trigger_ref,
        inputs=inputs,
        goal=goal,
        autonomy_level=pattern.autonomy_level,
        role_bindings=bindings,
        harness_snapshots=harness.snapshots,
        policy_snapshot=policy.model_dump(mode="json"),
        repository_snapshot=repository_snapshot_of(pattern),
        max_attempts=policy.maxAttempts,
        event_seq=1,
        retry_of=retry_of,
        trace_id=TRACE_ID.get() or new_trace_id(),  # the caller's traceparent, if any
        instruction_versions=pins,
    )
    data: dict[str, Any] = {
        "trigger": trigger_type,
        "ref": trigger_ref,
        "pattern_version": pattern.version,
    }
    if overrides is not None:
        data.update(harness_overrides=overrides, overrides_not_applied=harness.notices)
    LoopEvent.objects.create(
        run=run,
        seq=1,
        type="run.created",
        to_status=RunStatus.QUEUED,
        actor=actor,
        data=data,
    )
    run.harness_notices = harness.notices  # type: ignore[attr-defined]  # for the response
    if probe:
        breaker_start_probe(pattern, run.id)
        run_event_append(run_id=run.id, type="breaker.probe", actor=actor, data={})
    wakeups.run_changed(run.id)
    nudge_run(run.id)
    return run


def _refuse_when_spent(pattern: LoopPattern) -> None:
    now = timezone.now()
    spent = daily_exhaustion(pattern, now)
    if spent is not None:
        raise Conflict(
            f"Pattern {pattern.key!r} refuses new runs: {spent_message(spent, now)}.",
            budget=spent.data(),
        )


def _action_fields(action: str, actor: str, reason: str) -> dict[str, Any]:
    """The reason fields a human action leaves on the run (docs/runs.md): who did it and why;
    ``resume`` clears them, as the run is going again."""
    suffix = f": {reason}" if reason else ""
    if action == "cancel":
        return {"terminal_reason": "canceled", "failure_reason": f"Canceled by {actor}{suffix}"}
    if action == "accept":
        return {"terminal_reason": "accepted", "failure_reason": ""}
    if action == "escalate":
        return {"terminal_reason": "escalated", "failure_reason": f"Escalated by {actor}{suffix}"}
    if action == "pause":
        return {"terminal_reason": "paused", "failure_reason": f"Paused by {actor}{suffix}"}
    if action == "resume":
        return {"terminal_reason": "", "failure_reason": ""}
    return {}


def run_act(*, run_id: uuid.UUID, action: str, actor: str, reason: str = "") -> LoopRun:
    """Apply a human action (pause, resume, cancel, escalate, accept). 409 when not allowed."""
    spec = state.HUMAN_ACTIONS[action]
    try:
        run_transition(
            run_id=run_id,
            to=spec.target,
            actor=actor,
            event_type=spec.event_type,
            expected_from=spec.allowed_from,
            data={"reason": reason} if reason else {},
            fields=_action_fields(action, actor, reason),
        )
    except state.TransitionRefused as exc:
        raise Conflict(
            f"Cannot {action} a run that is '{exc.current}'.",
            current_status=exc.current,
            allowed_actions=state.allowed_actions(exc.current),
        ) from exc
    return LoopRun.objects.get(pk=run_id)


@transaction.atomic
def run_retry(*, run_id: uuid.UUID, actor: str) -> LoopRun:
    """Start a new run of the same pattern with the same inputs; the original stays as it is."""
    original = LoopRun.objects.select_related("pattern").get(pk=run_id)
    if original.status not in {s.value for s in state.RETRYABLE}:
        raise Conflict(
            f"Cannot retry a run that is '{original.status}'; only failed or canceled runs.",
            current_status=original.status,
            allowed_actions=state.allowed_actions(original.status),
        )
    return run_trigger(
        pattern=original.pattern,
        actor=actor,
        inputs=original.inputs,
        trigger_type="retry",
        trigger_ref=str(original.id),
        harness_overrides=run_harness_overrides(original),
        retry_of=original,
    )


def _created_data(run: LoopRun) -> dict[str, Any]:
    event = run.events.filter(type="run.created").only("data").first()
    return dict(event.data or {}) if event is not None else {}


def run_harness_overrides(run: LoopRun) -> dict[str, Any] | None:
    """The harness overrides ``run`` was triggered with (kept in its ``run.created`` event)."""
    return _created_data(run).get("harness_overrides")


def run_harness_notices(run: LoopRun) -> list[dict[str, Any]]:
    """What the run's overrides asked for and did not get, ``[{role, employee, field, asked,
    got, decidedBy}]``: kept on a run just triggered, else read from its ``run.created``."""
    known = getattr(run, "harness_notices", None)
    if known is not None:
        return list(known)
    return list(_created_data(run).get("overrides_not_applied") or [])


def runs_release_owner(*, owner: str) -> int:
    """A stopping worker gives back its leases: each run goes back to ``queued``."""
    held = list(
        LoopRun.objects.filter(lease_owner=owner).values_list("id", "lease_token", "status")
    )
    released = 0
    for run_id, token, _status in held:
        try:
            run_transition(
                run_id=run_id,
                to=RunStatus.QUEUED,
                actor=owner,
                lease=Lease(run_id, owner, token),
                event_type="lease.released",
            )
            released += 1
        except (LeaseLost, state.TransitionRefused):  # lost meanwhile: nothing to release
            continue
    return released


def run_is_canceled(run_id: uuid.UUID) -> bool:
    """Whether run ``run_id`` has been cancelled (tools ask it when their call is cancelled)."""
    return LoopRun.objects.filter(id=run_id, status=RunStatus.CANCELED).exists()
