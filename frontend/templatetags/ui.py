"""Presentation helpers for the UI templates: badges, times, durations, money, JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django import template
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from frontend.schema_fields import review_rows as _review_rows
from orchestrator.accounts.roles import Role, has_role, user_roles

register = template.Library()

#: Badge tone of each status (runs, steps, versions, verdicts). Every badge also shows its text,
#: so colour is never the only signal.
TONES: dict[str, str] = {
    "queued": "neutral",
    "preparing": "info",
    "waiting_lock": "info",
    "running": "info",
    "verifying": "info",
    "started": "info",
    "waiting_approval": "warn",
    "waiting_human": "warn",
    "paused": "warn",
    "blocked": "warn",
    "gated": "warn",
    "escalate": "warn",
    "draft": "warn",
    "succeeded": "ok",
    "completed": "ok",
    "approved": "ok",
    "published": "ok",
    "pass": "ok",
    "passed": "ok",
    "enabled": "ok",
    "configured": "ok",
    "failed": "bad",
    "reject": "bad",
    "not passed": "bad",
    "not set": "bad",
    "allow": "ok",
    "ask": "warn",
    "deny": "bad",
    "canceled": "muted",
    "pending": "warn",
    "rejected": "bad",
    "expired": "muted",
    "withdrawn": "muted",
    "disabled": "muted",
    "live": "ok",
    "revoked": "bad",
}
_ROLE_ORDER = (Role.ADMIN, Role.OPERATOR, Role.APPROVER, Role.VIEWER)


@register.simple_tag
def badge(value: Any, label: str = "") -> SafeString:
    """``<span class="badge badge-ok">succeeded</span>``: colour and text together."""
    text = str(value or "")
    tone = TONES.get(text, "neutral")
    return format_html(
        '<span class="badge badge-{}" data-status="{}">{}</span>',
        tone,
        text,
        label or text.replace("_", " "),
    )


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC) if timezone.is_aware(value) else value


@register.simple_tag
def dt(value: datetime | None, empty: str = "—") -> SafeString | str:
    """A timestamp: ISO 8601 UTC in ``datetime``, readable UTC text, turned local by app.js."""
    if value is None:
        return empty
    utc = _utc(value)
    return format_html(
        '<time datetime="{}" data-local>{} UTC</time>',
        utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
        utc.strftime("%Y-%m-%d %H:%M:%S"),
    )


def _compact(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


@register.simple_tag
def age(value: datetime | None) -> SafeString | str:
    """How long ago, compact ("42s", "5m", "3h 2m"); the exact time is in the tooltip."""
    if value is None:
        return "—"
    utc = _utc(value)
    return format_html(
        '<time datetime="{}" title="{} UTC">{} ago</time>',
        utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
        utc.strftime("%Y-%m-%d %H:%M:%S"),
        _compact((timezone.now() - value).total_seconds()),
    )


@register.filter
def duration_ms(value: int | float | None) -> str:
    if value is None:
        return "—"
    if value < 1000:
        return f"{int(value)} ms"
    seconds = value / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    return _compact(seconds)


@register.filter
def between(start: datetime | None, end: datetime | None) -> str:
    """The duration from ``start`` to ``end`` (or to now while unfinished)."""
    if start is None:
        return "—"
    delta: timedelta = (end or timezone.now()) - start
    return duration_ms(delta.total_seconds() * 1000)


@register.filter
def money(value: Decimal | float | None) -> str:
    """A cost with four decimals, or "—" when nothing was spent or counted."""
    if value is None or Decimal(str(value)) == 0:
        return "—"
    return f"{Decimal(str(value)):.4f}"


@register.filter
def count(value: int | None) -> str:
    if not value:
        return "—"
    return f"{value:,}"


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, cls=DjangoJSONEncoder)


@register.filter
def review_rows(value: Any, schema: Any = None) -> list[tuple[str, str]]:
    """An approval's review as (label, text) rows in its schema's order
    (``frontend.schema_fields.review_rows``)."""
    return _review_rows(value, schema)


@register.filter
def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), cls=DjangoJSONEncoder)


@register.filter
def short_id(value: Any) -> str:
    """The last 8 hex digits of a run id: its random part (a UUIDv7 begins with the time, so
    runs created together share their first digits)."""
    return str(value).replace("-", "")[-8:]


@register.filter
def label(value: Any) -> str:
    return str(value or "").replace("_", " ")


@register.simple_tag
def roles_of(user: Any) -> list[str]:
    """The user's roles, strongest first (``admin`` implies the others, so it stands alone)."""
    roles = user_roles(user)
    if Role.ADMIN in roles:
        return [Role.ADMIN.value]
    return [r.value for r in _ROLE_ORDER if r in roles]


def _message_text(message: Any) -> str:
    if isinstance(message, dict):
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):  # content parts
            return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


@register.filter
def step_preview(step: Any) -> str:
    """The text a model step produced (or a notice said), for a one-paragraph preview."""
    response = step.response if isinstance(step.response, dict) else {}
    if step.kind == "model":
        return _message_text(response.get("message"))
    if step.kind == "notice":
        return _message_text(response)
    return ""


@register.filter
def step_tool_calls(step: Any) -> list[str]:
    """Names of the tools a model step asked for."""
    response = step.response if isinstance(step.response, dict) else {}
    message = response.get("message")
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    names = []
    for call in calls or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and function.get("name"):
            names.append(str(function["name"]))
    return names


#: The trust tiers of seed 004, by a tool's declared effect.
_TIERS = {"read": "read", "write": "write", "external": "high-risk"}


@register.filter
def tier_of(effect: Any) -> str:
    """The trust tier of a tool's effect (``external`` is the high-risk tier)."""
    return _TIERS.get(str(effect), str(effect))


@register.filter
def step_tools_listed(step: Any) -> list[str]:
    """``name (tier)`` of each tool a model step listed to the model (its LIST_TOOLS)."""
    request = step.request if isinstance(step.request, dict) else {}
    tiers = request.get("tool_tiers")
    if not isinstance(tiers, dict):
        return []
    return [f"{name} ({tier_of(effect)})" for name, effect in tiers.items()]


@register.filter
def step_arguments(step: Any) -> Any:
    """A tool step's arguments (the runtime stores them under ``arguments``)."""
    request = step.request if isinstance(step.request, dict) else {}
    return request.get("arguments", request)


@register.filter
def step_result(step: Any) -> Any:
    """A tool step's result: its text content when that is all there is, else the JSON."""
    response = step.response
    if isinstance(response, dict) and response.get("images"):
        # The images' data URLs stay out of the page; step_images counts them.
        response = {k: v for k, v in response.items() if k != "images"}
    if isinstance(response, dict) and set(response) <= {"content", "disposition"}:
        return response.get("content", response)
    return response


@register.filter
def step_images(step: Any) -> int:
    """How many images a tool step's result carried (sent to a vision endpoint)."""
    response = step.response
    images = response.get("images") if isinstance(response, dict) else None
    return len(images) if isinstance(images, list) else 0


@register.filter
def is_text(value: Any) -> bool:
    return isinstance(value, str)


@register.simple_tag(takes_context=True)
def nav_current(context: template.Context, section: str) -> SafeString:
    """``aria-current="page"`` on the navigation link of the page's section."""
    request = context.get("request")
    path = getattr(request, "path", "")
    prefixes = {
        "monitor": ("/runs",),
        "patterns": ("/patterns",),
        "policies": ("/policies",),
        "instructions": ("/instructions",),
        "employees": ("/employees", "/endpoints"),
        "gateway": ("/gateway",),
        "approvals": ("/approvals",),
        "skills": ("/skills",),
        "connectors": ("/connectors",),
        "a2a-agents": ("/a2a-agents",),
        "memory": ("/memory",),
        "knowledge": ("/knowledge",),
        "metrics": ("/ui/metrics",),
        "api-tokens": ("/api-tokens",),
    }
    current = path == "/" if section == "monitor" else False
    current = current or path.startswith(prefixes.get(section, ()))
    return SafeString('aria-current="page"' if current else "")


@register.simple_tag(takes_context=True)
def user_can(context: template.Context, role: str) -> bool:
    """Whether the viewer holds ``role`` (to show or hide buttons; views check again)."""
    return has_role(context.get("user"), Role(role))


@register.filter
def seconds(value: float | None) -> str:
    """A duration in seconds, compact ("42s", "3m", "2h 5m"); "—" when there is none."""
    return "—" if value is None else _compact(value)


def _diff_class(line: str) -> str:
    if line.startswith(("+++", "---", "diff --git", "index ")):
        return "diff-file"
    if line.startswith("@@"):
        return "diff-hunk"
    if line.startswith("+"):
        return "diff-add"
    if line.startswith("-"):
        return "diff-del"
    return "diff-ctx"


@register.filter
def diff_lines(text: str | None) -> list[tuple[str, str]]:
    """A unified diff as (css class, line) pairs; the template escapes the lines."""
    return [(_diff_class(line), line) for line in (text or "").splitlines()]


@register.filter
def truncate_chars(text: str | None, limit: int) -> str:
    text = text or ""
    return text if len(text) <= limit else text[:limit]


@register.filter
def tool_run_ms(step: Any) -> int:
    """A tool step's own running time: its duration less its approval wait."""
    return max(int(step.duration_ms or 0) - int(getattr(step, "approval_wait_ms", 0) or 0), 0)


@register.filter
def step_plan(step: Any) -> list[dict[str, Any]]:
    """The tasks of a leader's answer when it is a plan (JSON with ``tasks``), else []."""
    if getattr(step, "role", "") != "leader":
        return []
    try:
        parsed = json.loads(step_preview(step))
    except ValueError:
        return []
    tasks = parsed.get("tasks") if isinstance(parsed, dict) else None
    if not isinstance(tasks, list):
        return []
    return [t for t in tasks if isinstance(t, dict) and t.get("title")]
