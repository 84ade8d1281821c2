"""The ``limits`` and ``isolation`` of a role's compiled harness, as the engine binds them.

Pure: no database and no Django. Each role of a run has its own snapshot
(``run.harness_snapshots``); the invocation about to act is judged by its role's.

* ``limits.maxInvocations``, ``maxToolCalls``, ``maxTokens``, ``maxCost`` are per-run totals over
  the same usage buckets as the pattern's ``budgets.perRun`` (``invocations``, ``toolCalls``,
  ``tokens``, ``cost``), judged at the same points. :func:`tightened` folds them into a run's
  :class:`~loops.services.budget_rules.RunLimits`: the stricter value wins, a tie goes to the
  harness (a budget raise could not lift it), and ``RunLimits.harness`` says which metrics the
  harness decided, so their exhaustion ends the run ``failed`` (``harness_limit:<field>``)
  instead of blocking it.
* The lease holder's journal keeps a tally of the run's usage (read at the invocation's start,
  then added to as it writes; it is the only writer of the run's buckets) and asks the database
  to judge a harness limit only when the tally says the next unit could cross it
  (:meth:`HarnessLimits.near`): far from its limits a step costs no more than before.
* ``limits.recursionLimit`` caps model steps per invocation (``runtime.loop``),
  ``limits.timeoutMs`` the working time of the run (:func:`working_seconds`), and
  ``isolation.mode`` / ``isolation.requireWorktree`` refuse a run without a git worktree
  (:func:`isolation_refusal`).
* ``limits.modelRetryWindowMs`` bounds a model wait (every endpoint failing, the run parked
  for a retry): :func:`model_retry_delay` says how long the next park may be, or that the
  window is over and the run fails (``model_unavailable``, :func:`model_unavailable_reason`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from runtime.invocation import HarnessLimitReached

#: Budget metric → the harness field that bounds the same usage.
FIELDS: dict[str, str] = {
    "invocations": "limits.maxInvocations",
    "toolCalls": "limits.maxToolCalls",
    "tokens": "limits.maxTokens",
    "cost": "limits.maxCost",
}
TIMEOUT = "limits.timeoutMs"
RECURSION = "limits.recursionLimit"
MODEL_RETRY_WINDOW = "limits.modelRetryWindowMs"
#: The window of a snapshot compiled before the setting existed (the platform default).
MODEL_RETRY_WINDOW_DEFAULT_MS = 30 * 60 * 1000
#: The terminal reason of a run whose model calls kept failing (or were not worth retrying).
MODEL_UNAVAILABLE = "model_unavailable"
#: Run statuses whose time counts as working time (a worker drives the run).
WORKING = frozenset({"running", "verifying"})

_QUANTUM = Decimal("0.000001")

_WHAT_RAN = {
    "invocations": "{} invocations ran",
    "toolCalls": "{} tool calls were made",
    "tokens": "{} tokens were used",
    "cost": "{} was spent",
}


def _amount(value: Any) -> Decimal:
    return Decimal(str(value)).quantize(_QUANTUM)


def _shown(value: Decimal | float | int) -> str:
    number = Decimal(str(value))
    return str(int(number)) if number == number.to_integral_value() else f"{float(number):g}"


@dataclass(frozen=True)
class HarnessBound:
    """One harness setting as a bound: its field, value and the layer that set it."""

    setting: str
    value: Decimal
    layer: str

    @property
    def label(self) -> str:
        """``limits.maxInvocations = 2 (set by profile:tight@1)``."""
        return f"{self.setting} = {_shown(self.value)} (set by {self.layer})"

    def data(self) -> dict[str, Any]:
        value: int | float = (
            int(self.value) if self.value == self.value.to_integral_value() else float(self.value)
        )
        return {"setting": self.setting, "value": value, "layer": self.layer}

    def reached(self, metric: str, used: Decimal | float | int) -> HarnessLimitReached:
        """The halt of a run whose ``metric`` usage (``used``) met this bound."""
        reason = f"{self.label}: {_WHAT_RAN[metric].format(_shown(used))}"
        data = {
            **self.data(),
            "metric": metric,
            "used": float(used) if metric == "cost" else int(used),
        }
        return HarnessLimitReached(reason, code=f"harness_limit:{self.setting}", data=data)


def bound_of(snapshot: Mapping[str, Any] | None, setting: str) -> HarnessBound | None:
    """The bound ``setting`` (``section.key``) of a role's snapshot; None when it has none."""
    if not snapshot:
        return None
    section, key = setting.split(".", 1)
    value = ((snapshot.get("settings") or {}).get(section) or {}).get(key)
    if value is None or isinstance(value, bool):
        return None
    layer = str((snapshot.get("provenance") or {}).get(setting) or "default")
    return HarnessBound(setting, _amount(value), layer)


@dataclass(frozen=True)
class HarnessLimits:
    """The per-run totals a role's snapshot sets (budget metric → bound)."""

    bounds: Mapping[str, HarnessBound] = field(default_factory=dict)

    def near(self, usage: Mapping[str, Decimal], amounts: Mapping[str, Any]) -> bool:
        """Could taking ``amounts`` (metric → n; 0 for a metered metric's room) reach a bound,
        by the journal's tally ``usage``? Only then does the database judge the harness."""
        for metric, n in amounts.items():
            bound = self.bounds.get(metric)
            if bound is None:
                continue
            used = usage.get(metric, Decimal(0))
            if (used + _amount(n) > bound.value) if n else (used >= bound.value):
                return True
        return False


def harness_limits_of(snapshot: Mapping[str, Any] | None) -> HarnessLimits:
    bounds = {metric: b for metric, s in FIELDS.items() if (b := bound_of(snapshot, s)) is not None}
    return HarnessLimits(bounds)


def tightened(limits: Any, harness: HarnessLimits | None) -> Any:
    """``limits`` (a RunLimits) with the harness bounds folded into its per-run limits: the
    stricter wins, a tie goes to the harness; ``harness`` of the result names the metrics the
    harness decided."""
    if harness is None or not harness.bounds:
        return limits
    per_run = dict(limits.per_run)
    decided: dict[str, HarnessBound] = {}
    for metric, bound in harness.bounds.items():
        budget = per_run.get(metric)
        if budget is None or bound.value <= budget:
            per_run[metric] = bound.value
            decided[metric] = bound
    return dataclasses.replace(limits, per_run=per_run, harness=decided)


# --- time ----------------------------------------------------------------------------------


def working_seconds(changes: Iterable[tuple[str, datetime]], now: datetime) -> float:
    """Seconds the run spent in a working status (running, verifying), from its status
    changes in order (``to_status``, when); time parked (for a human, a lock, a retry) does
    not count."""
    total, since = 0.0, None
    for status, at in changes:
        if status in WORKING and since is None:
            since = at
        elif status not in WORKING and since is not None:
            total += (at - since).total_seconds()
            since = None
    if since is not None:
        total += (now - since).total_seconds()
    return max(total, 0.0)


@dataclass(frozen=True)
class Deadline:
    """The wall clock an invocation (one drive) may take: the run's ``limits.timeoutMs`` less
    the working time it already spent."""

    bound: HarnessBound
    worked: float

    @property
    def seconds(self) -> float:
        return float(self.bound.value) / 1000 - self.worked

    def reached(self, worked: float) -> HarnessLimitReached:
        reason = f"{self.bound.label}: the run worked {worked:.1f} s"
        data = {**self.bound.data(), "worked_seconds": round(worked, 3)}
        return HarnessLimitReached(reason, code=f"harness_limit:{TIMEOUT}", data=data)


# --- model waits ---------------------------------------------------------------------------


def model_retry_window(snapshot: Mapping[str, Any] | None) -> HarnessBound:
    """The role's ``limits.modelRetryWindowMs`` (the platform default for a snapshot compiled
    before the setting existed)."""
    bound = bound_of(snapshot, MODEL_RETRY_WINDOW)
    if bound is not None:
        return bound
    return HarnessBound(MODEL_RETRY_WINDOW, _amount(MODEL_RETRY_WINDOW_DEFAULT_MS), "default")


def model_retry_delay(window: HarnessBound, waited: float, delay: float) -> float | None:
    """How long a run that has waited ``waited`` seconds for a model parks before its next try,
    given the providers' hint ``delay`` (the breaker's next probe, a Retry-After): the hint, but
    never past the end of the window, so the last try comes at its end. None: the window is
    over (or 0), and the run fails."""
    remaining = float(window.value) / 1000 - waited
    if remaining <= 0:
        return None
    return min(delay, remaining)


def model_unavailable_reason(
    window: HarnessBound, detail: Mapping[str, Any], waited: float, tries: int
) -> str:
    """The ``failure_reason`` of a run whose model wait reached ``window``: the setting, the
    endpoint and its last error, how long and how many tries."""
    endpoint = str(detail.get("endpoint") or "") or "the model"
    counted = f", {tries} tries" if tries > 1 else ""
    error, refused = str(detail.get("error") or ""), str(detail.get("refused") or "")
    last = error or refused or "unknown"
    now = f"; then {refused}" if error and refused else ""
    return (
        f"{window.label}: model endpoint {endpoint} did not answer for {waited:.1f} s"
        f"{counted}; last error: {last}{now}"
    )


# --- isolation -----------------------------------------------------------------------------


def isolation_refusal(
    snapshots: Mapping[str, Any], repository: Mapping[str, Any]
) -> HarnessLimitReached | None:
    """Why a run may not start without a git worktree: a role's snapshot requires one
    (``isolation.requireWorktree`` or ``isolation.mode: worktree``) and the pattern has no
    repository (its workspace would be a plain folder). None: it may start."""
    if repository.get("repositoryRoot"):
        return None
    for role, snapshot in _roles(snapshots):
        isolation = (snapshot.get("settings") or {}).get("isolation") or {}
        provenance = snapshot.get("provenance") or {}
        if isolation.get("requireWorktree") is True:
            setting, value = "isolation.requireWorktree", "true"
        elif isolation.get("mode") == "worktree":
            setting, value = "isolation.mode", "worktree"
        else:
            continue
        layer = str(provenance.get(setting) or "default")
        reason = (
            f"{setting} = {value} (set by {layer}) for the {role}: the pattern has no "
            "repository, so the run would work in a plain folder, not a git worktree"
        )
        data = {"setting": setting, "value": value, "layer": layer, "role": role}
        return HarnessLimitReached(reason, code=f"harness_limit:{setting}", data=data)
    return None


def _roles(snapshots: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    if snapshots.get("leader"):
        yield "leader", snapshots["leader"]
    for username, snapshot in sorted((snapshots.get("makers") or {}).items()):
        if snapshot:
            yield f"maker {username}", snapshot
    if snapshots.get("verifier"):
        yield "verifier", snapshots["verifier"]
