"""What the A2A layer knows of a caller, a served pattern and a run: plain values read by
:mod:`a2a_server.services` and turned into protocol objects by :mod:`a2a_server.protocol`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class A2ACaller:
    """The owner of a valid API token: ``can_read`` with any role, ``can_operate`` (start and
    cancel runs) as an operator or admin, as the trigger and cancel APIs."""

    user_id: int
    username: str
    can_read: bool
    can_operate: bool


@dataclass(frozen=True)
class ServedPattern:
    """A pattern with ``a2a_enabled``: what its agent card is made of."""

    key: str
    title: str
    description: str
    goal_template: str
    version: int
    inputs: tuple[str, ...]


@dataclass(frozen=True)
class EvidenceView:
    """An artifact of the run that the verifier cited as evidence for ``checks``."""

    id: str
    kind: str
    name: str
    content_type: str
    content: str
    checks: tuple[str, ...]


@dataclass(frozen=True)
class RunView:
    """A run as its A2A task shows it (the task id is the run id)."""

    id: str
    pattern: str
    status: str
    context_id: str
    updated_at: datetime
    terminal_reason: str = ""
    failure_reason: str = ""
    verdict: dict[str, Any] | None = None
    evidence: tuple[EvidenceView, ...] = ()
    pending_tools: tuple[str, ...] = ()
