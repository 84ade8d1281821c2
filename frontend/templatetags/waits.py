"""A run's waits in the UI: what a waiting run waits on (its ``wait`` record's detail), and the
one line of the event that starts a wait and of the ``wait.ended`` that ends it."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django import template
from django.utils.dateparse import parse_datetime

from frontend.selectors.runs import STEP_FIELD_SEPARATOR, invocation_title

register = template.Library()

#: What ended a wait, by the event type that ended it (``wait.ended``'s ``ended_by``).
ENDED_BY = {
    "run.started": "locks taken",
    "lock.timeout": "timed out",
    "run.canceled": "canceled",
    "run.paused": "paused",
    "model.answered": "the model answered",
    "run.failed": "the run failed",
}


def _run(run_id: Any) -> str:
    return str(run_id)[:8]


def duration_text(seconds: float) -> str:
    """``42.5 s``, ``4m 02s``, ``1h 05m``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def lock_text(detail: Mapping[str, Any]) -> str:
    """``path lock on src/app.py held by run 01a23c5c, queued behind run 0b3c4d5e`` (runs that
    waited longer for the same paths are served first)."""
    paths = list(detail.get("paths") or [])
    holders = [_run(r) for r in detail.get("held_by") or []]
    ahead = [_run(r) for r in detail.get("ahead") or []]
    text = f"path lock{'s' if len(paths) > 1 else ''} on {', '.join(paths) or '?'}"
    if holders:
        text += f" held by run{'s' if len(holders) > 1 else ''} {', '.join(holders)}"
    if ahead:
        text += f"{',' if holders else ''} queued behind run{'s' if len(ahead) > 1 else ''} "
        text += ", ".join(ahead)
    return text


def model_text(detail: Mapping[str, Any]) -> str:
    """``model endpoint e1 (last error: …)``."""
    text = f"model endpoint {detail.get('endpoint') or '?'}"
    if detail.get("error"):
        text += f" (last error: {str(detail['error'])[:120]})"
    return text


def waiting_on(wait: Mapping[str, Any] | None) -> str:
    """What a run's ``wait`` record says it waits on; empty when it waits on nothing."""
    if not wait:
        return ""
    detail = wait.get("detail") or {}
    if wait.get("kind") == "lock":
        return lock_text(detail)
    if wait.get("kind") == "model":
        return model_text(detail)
    return str(wait.get("kind") or "")


def ended_text(data: Mapping[str, Any]) -> str:
    """``waited 4m 02s, 120 polls, longest gap 2.1 s (locks taken)``."""
    polls = int(data.get("polls") or 0)
    text = (
        f"waited {duration_text(float(data.get('waited_seconds') or 0))}, "
        f"{polls} poll{'' if polls == 1 else 's'}, "
        f"longest gap {float(data.get('longest_gap_seconds') or 0):.1f} s"
    )
    by = str(data.get("ended_by") or "")
    return f"{text} ({ENDED_BY.get(by, by)})" if by else text


def wait_line(event_type: str, data: Mapping[str, Any] | None) -> str:
    """The one line of an event that starts or ends a wait; empty for other events."""
    data = data or {}
    if event_type == "lock.waiting":
        return f"waiting for {lock_text(data)}"
    if event_type == "run.retry_later" and data.get("kind") == "model":
        return f"waiting for {model_text(data)}"
    if event_type == "wait.ended":
        return ended_text(data)
    return ""


@register.filter(name="wait_line")
def wait_line_filter(event: Any) -> str:
    """``{{ event|wait_line }}``: :func:`wait_line` of a LoopEvent."""
    return wait_line(str(getattr(event, "type", "")), getattr(event, "data", None))


@register.filter(name="waiting_on")
def waiting_on_filter(run: Any) -> str:
    """``{{ run|waiting_on }}``: :func:`waiting_on` of a run's ``wait`` record."""
    return waiting_on(getattr(run, "wait", None))


@register.filter(name="wait_since")
def wait_since(wait: Mapping[str, Any] | None) -> datetime | None:
    """``{% dt run.wait|wait_since %}``: when the wait began, as a datetime."""
    return parse_datetime(str((wait or {}).get("since") or "")) if wait else None


#: Statuses in which a run is being driven (what it is doing is worth a line).
_ACTIVE = ("preparing", "running", "verifying", "waiting_approval", "waiting_lock")


@register.filter(name="doing")
def doing(run: Any) -> str:
    """``Maker 1 (alice) · tool write``: the role and the step a run is at, from its latest
    step (``runs_for_table``'s annotations); empty when the run is not under way."""
    if str(getattr(run, "status", "")) not in _ACTIVE:
        return ""
    latest = str(getattr(run, "latest_step", "") or "")
    invocation, kind, name = [*latest.split(STEP_FIELD_SEPARATOR), "", "", ""][:3]
    if not invocation:
        return "preparing" if run.status == "preparing" else "starting"
    title, employee = invocation_title(invocation, getattr(run, "role_bindings", None) or {})
    who = f"{title} ({employee})" if employee else title
    step = f"tool {name}" if kind == "tool" and name else kind
    return f"{who} · {step}" if step else who


@register.filter(name="run_cost")
def run_cost(run: Any) -> str:
    """A runs table's cost cell: the cost, ``unpriced`` when tokens were used at a cost of 0
    (the endpoint has no prices), ``—`` when nothing was used."""
    cost = getattr(run, "cost_total", None)
    if cost:
        return f"{cost:.4f}"
    used = (getattr(run, "tokens_in_total", 0) or 0) + (getattr(run, "tokens_out_total", 0) or 0)
    return "unpriced" if used else "—"
