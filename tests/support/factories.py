"""Rows for tests, built directly (bypassing services) with only what a test cares about."""

from __future__ import annotations

from itertools import count
from typing import Any

from loops.models import LoopEvent, LoopPattern, LoopRun, RunStatus

_seq = count(1)


def make_pattern(**fields: Any) -> LoopPattern:
    n = next(_seq)
    defaults: dict[str, Any] = {
        "key": f"pattern-{n}",
        "goal_template": "Do the thing {{ inputs.get('what', '') }}",
        "leader_username": "leader",
        "maker_usernames": ["maker"],
        "verifier_username": "verifier",
    }
    defaults.update(fields)
    return LoopPattern.objects.create(**defaults)


def make_run(
    pattern: LoopPattern | None = None, *, status: str = RunStatus.QUEUED, **fields: Any
) -> LoopRun:
    pattern = pattern or make_pattern()
    defaults: dict[str, Any] = {
        "pattern": pattern,
        "status": status,
        "goal": "a goal",
        "role_bindings": {
            "leader": pattern.leader_username,
            "makers": list(pattern.maker_usernames),
            "verifier": pattern.verifier_username,
        },
        "event_seq": 1,
    }
    defaults.update(fields)
    run = LoopRun.objects.create(**defaults)
    LoopEvent.objects.create(run=run, seq=1, type="run.created", to_status=status)
    return run
