"""The limits of one tool-loop invocation (:class:`LoopSettings`) and the harness's cap on its
model steps (``limits.recursionLimit``); ``runtime.loop`` re-exports both."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from runtime.execution import ExecutionLimits
from runtime.invocation import InvocationRequest
from runtime.repetition import RepetitionLimits


@dataclass(frozen=True)
class LoopSettings:
    """Limits of one invocation (docs/tool-loop.md "Limits and defaults")."""

    max_steps: int = 12
    tool_concurrency: int = 4
    tool_timeout_seconds: float = 60.0
    max_tool_output_chars: int = 50_000
    #: The model's context window, and the part of it kept free for the answer.
    context_window_tokens: int = 128_000
    response_reserve_tokens: int = 8_192
    repetition: RepetitionLimits = field(default_factory=RepetitionLimits)
    #: The harness setting that capped ``max_steps`` (``limits.recursionLimit``, its value and
    #: layer), named when the invocation runs out of steps; None: the employee's own cap.
    step_cap: dict[str, Any] | None = field(default=None, compare=False)
    #: Every model request of the invocation asks for a streamed answer (the employee's
    #: ``streaming``); what is persisted is the same either way.
    stream: bool = False

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.tool_concurrency < 1 or self.max_tool_output_chars < 1:
            raise ValueError("max_steps, tool_concurrency and max_tool_output_chars must be >= 1")
        if self.tool_timeout_seconds <= 0 or self.context_budget_tokens < 1:
            raise ValueError("tool timeout and context budget must be positive")

    @property
    def context_budget_tokens(self) -> int:
        return self.context_window_tokens - self.response_reserve_tokens

    def execution_limits(self) -> ExecutionLimits:
        return ExecutionLimits(
            concurrency=self.tool_concurrency,
            timeout_seconds=self.tool_timeout_seconds,
            max_output_chars=self.max_tool_output_chars,
        )


RECURSION_LIMIT = "limits.recursionLimit"


def harness_step_cap(settings: LoopSettings, request: InvocationRequest) -> LoopSettings | int:
    """``settings`` with model steps capped by the role's ``limits.recursionLimit``:
    ``min(employee.max_steps, recursionLimit)``. A cap of 0 (no model step at all) comes back
    as 0."""
    snapshot = request.harness or {}
    value = ((snapshot.get("settings") or {}).get("limits") or {}).get("recursionLimit")
    if not isinstance(value, int) or isinstance(value, bool) or value >= settings.max_steps:
        return settings
    if value < 1:
        return 0
    layer = str((snapshot.get("provenance") or {}).get(RECURSION_LIMIT) or "default")
    cap = {"setting": RECURSION_LIMIT, "value": value, "layer": layer}
    return replace(settings, max_steps=value, step_cap=cap)


def cap_label(cap: dict[str, Any]) -> str:
    return f"{cap['setting']} = {cap['value']} (set by {cap['layer']})"
