"""What ``loopwright`` prints of a live run: its stream's messages parsed, steps as lines.

No Django and nothing of the project: ``bin/loopwright`` runs ``orchestrator/cli.py`` as a bare
file, which loads this one from its own folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any


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


def money(value: float) -> str:
    return f"${value:.4f}"


def step_line(step: dict[str, Any], totals: dict[str, float]) -> str:
    """One line: time, step seq, role, tool or model and its name, status, duration, and for
    a finished model step its tokens and cost with the run's totals so far."""
    parts = [
        _clock(step.get("finished_at") or step.get("started_at")),
        f"step {step.get('seq')}",
        str(step.get("role") or "?"),
        f"{step.get('kind')} {step.get('name') or ''}".rstrip(),
        str(step.get("status")),
    ]
    if step.get("duration_ms") is not None:
        parts.append(f"{int(step['duration_ms']) / 1000:.1f} s")
    tokens = (int(step.get("tokens_in") or 0), int(step.get("tokens_out") or 0))
    cost = float(step.get("cost") or 0)
    if any(tokens) or cost:
        parts.append(f"tokens {tokens[0]}→{tokens[1]}  {money(cost)}")
        parts.append(f"(run: {int(totals['tokens']):,} tokens, {money(totals['cost'])})")
    if step.get("error"):
        parts.append(f"error: {_short(step['error'])}")
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
