"""What ``loopwright`` prints of a live run: its stream's messages parsed, events, waits and
steps as lines.

No Django and nothing of the project: ``bin/loopwright`` runs ``orchestrator/cli.py`` as a bare
file, which loads this one from its own folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from orchestrator.cli_color import PLAIN, Palette


def _clock(stamp: str | None) -> str:
    if not stamp:
        return "--:--:--"
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).strftime("%H:%M:%S")
    except ValueError:
        return stamp[:8]


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def sse_messages(lines: Iterable[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Server-sent events as (event, data): ``data`` one line of JSON; comments skipped."""
    event, data = "message", ""
    for line in lines:
        if not line:
            if data:
                yield event, json.loads(data)
            event, data = "message", ""
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data += value


#: What a model call that reported tokens and no cost cost: its endpoint has no prices.
UNKNOWN_COST = "cost unknown"


def money(value: float) -> str:
    return f"${value:.4f}"


def cost_text(totals: dict[str, float]) -> str:
    """``$0.0300``; ``cost unknown`` when only unpriced models answered; the known part and a
    note when some were unpriced (``totals``: cost, and unpriced, a count of such calls)."""
    if not totals.get("unpriced"):
        return money(totals["cost"])
    if not totals["cost"]:
        return UNKNOWN_COST
    return f"{money(totals['cost'])} + {UNKNOWN_COST} (unpriced models)"


def step_line(step: dict[str, Any], totals: dict[str, float], paint: Palette = PLAIN) -> str:
    """One line: time, step seq, role, tool or model and its name, status, duration, and for
    a finished model step its tokens and cost with the run's totals so far."""
    parts = [
        _clock(step.get("finished_at") or step.get("started_at")),
        f"step {step.get('seq')}",
        paint.role(str(step.get("role") or "?")),
        f"{step.get('kind')} {step.get('name') or ''}".rstrip(),
        paint.status(str(step.get("status"))),
    ]
    if step.get("duration_ms") is not None:
        parts.append(f"{int(step['duration_ms']) / 1000:.1f} s")
    tokens = (int(step.get("tokens_in") or 0), int(step.get("tokens_out") or 0))
    cost = float(step.get("cost") or 0)
    if any(tokens) or cost:
        parts.append(f"tokens {tokens[0]}→{tokens[1]}  {money(cost) if cost else UNKNOWN_COST}")
        parts.append(f"(run: {int(totals['tokens']):,} tokens, {cost_text(totals)})")
    if step.get("error"):
        parts.append(paint.error(f"error: {_short(step['error'])}"))
    return "  ".join(parts)


def approval_commands(approvals: Sequence[dict[str, Any]]) -> list[str]:
    """What to type to decide each pending approval."""
    lines = []
    for approval in approvals:
        lines.append(
            f"  approval {approval['id']}: {approval.get('tool_name')} "
            f"{_short(approval.get('arguments'), 80)}"
        )
        lines.append(
            f"    loopwright approve {approval['id']}   or   "
            f"loopwright reject {approval['id']} --reason TEXT"
        )
    return lines


# --- events and waits ---------------------------------------------------------------------------


def format_event(event: dict[str, Any], paint: Palette = PLAIN) -> str:
    """One line: time, type, from→to, actor, and a few data items (for an event that starts
    or ends a wait, what it waits on or how long it waited, instead of the items)."""
    moved = ""
    if event.get("to_status") and event.get("to_status") != event.get("from_status"):
        moved = f"{event.get('from_status') or '·'}→{paint.status(str(event['to_status']))}"
    data = event.get("data") or {}
    items = _wait_line(str(event.get("type") or ""), data) or " ".join(
        f"{k}={_short(v)}" for k, v in list(data.items())[:4] if v not in ("", None)
    )
    actor = f"by {event['actor']}" if event.get("actor") else ""
    parts = [_clock(event.get("created_at")), f"#{event.get('seq')}", event.get("type", "?")]
    return "  ".join(p for p in [*parts, moved, actor, items] if p)


#: What ended a wait, by the event type that ended it (``wait.ended``'s ``ended_by``). The CLI
#: runs as a bare file importing nothing of the project, so these words repeat the run page's
#: (frontend/templatetags/waits.py); tests/ui/test_waits_shown.py holds both to the same lines.
_WAIT_ENDED_BY = {
    "run.started": "locks taken",
    "lock.timeout": "timed out",
    "run.canceled": "canceled",
    "run.paused": "paused",
    "model.answered": "the model answered",
    "run.failed": "the run failed",
}


def _wait_duration(seconds: float) -> str:
    """``42.5 s``, ``4m 02s``, ``1h 05m``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def _wait_line(kind: str, data: dict[str, Any]) -> str:
    """The one line of an event that starts a wait (``lock.waiting``, a model's
    ``run.retry_later``) or ends it (``wait.ended``); empty for any other event."""
    if kind == "lock.waiting":
        wanted = list(data.get("paths") or [])
        paths = ", ".join(wanted) or "?"
        holders = [str(r)[:8] for r in data.get("held_by") or []]
        held = f" held by run{'s' if len(holders) > 1 else ''} {', '.join(holders)}"
        locks = "locks" if len(wanted) > 1 else "lock"
        ahead = [str(r)[:8] for r in data.get("ahead") or []]
        behind = f"{',' if holders else ''} queued behind run{'s' if len(ahead) > 1 else ''} "
        queued = behind + ", ".join(ahead) if ahead else ""
        return f"waiting for path {locks} on {paths}{held if holders else ''}{queued}"
    if kind == "run.retry_later" and data.get("kind") == "model":
        error = f" (last error: {_short(data['error'])})" if data.get("error") else ""
        return f"waiting for model endpoint {data.get('endpoint') or '?'}{error}"
    if kind == "wait.ended":
        polls = int(data.get("polls") or 0)
        by = str(data.get("ended_by") or "")
        text = (
            f"waited {_wait_duration(float(data.get('waited_seconds') or 0))}, "
            f"{polls} poll{'' if polls == 1 else 's'}, "
            f"longest gap {float(data.get('longest_gap_seconds') or 0):.1f} s"
        )
        return f"{text} ({_WAIT_ENDED_BY.get(by, by)})" if by else text
    return ""
