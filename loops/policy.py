"""The pattern policy: a strict schema for the ``policy`` JSON of a loop pattern.

Keys are camelCase as in the source specification. Unknown keys are refused, so a typo never
silently turns a limit off.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.errors import InvalidInput
from runtime.guardrails_config import guardrail_problems, parse_guardrail_config
from runtime.schema_keys import unknown_key_detail


class _StrictPolicyModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Budget(_StrictPolicyModel):
    """Upper bounds; an absent value means no bound at this level."""

    invocations: int | None = Field(default=None, ge=0)
    toolCalls: int | None = Field(default=None, ge=0)
    verifications: int | None = Field(default=None, ge=0)
    #: Not a budget metric: sub-agents are bounded per invocation by the harness ``delegation``
    #: section (docs/sub-agents.md); present only to refuse a limit nothing would count.
    delegations: Any = Field(default=None, exclude=True)

    @field_validator("delegations")
    @classmethod
    def _no_delegations(cls, value: Any) -> None:
        if value is not None:
            raise ValueError(
                "nothing counts delegations as a budget: bound sub-agents with the harness "
                "delegation section (maxDepth, maxCount, allowedEmployees) and remove this limit"
            )

    tokens: int | None = Field(default=None, ge=0)
    cost: float | None = Field(default=None, ge=0)


class Budgets(_StrictPolicyModel):
    perRun: Budget = Budget()
    daily: Budget = Budget()


class CircuitBreakerPolicy(_StrictPolicyModel):
    failureThreshold: int = Field(default=5, ge=1, le=1000)
    cooldownSeconds: int = Field(default=300, ge=1, le=86_400)


class ApprovalPolicy(_StrictPolicyModel):
    autoAllowlist: list[str] = []
    approvers: list[str] = []
    timeoutSeconds: int | None = Field(default=None, ge=1)
    onTimeout: Literal["reject", "escalate"] = "reject"


class ToolLoopPolicy(_StrictPolicyModel):
    warnAt: int = Field(default=5, ge=1)
    blockAt: int = Field(default=8, ge=1)
    escalateAt: int = Field(default=12, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> ToolLoopPolicy:
        if not self.warnAt <= self.blockAt <= self.escalateAt:
            raise ValueError("toolLoop thresholds must satisfy warnAt <= blockAt <= escalateAt")
        return self


class SemanticCachePolicy(_StrictPolicyModel):
    """Opt-in answers from earlier read-only model calls of the pattern (docs/semantic-cache.md);
    when enabled, the pattern save requires an existing embedding endpoint and a model."""

    enabled: bool = False
    threshold: float = Field(default=0.95, ge=0.5, le=1.0)
    ttlSeconds: int = Field(default=3600, ge=1, le=2_592_000)
    #: The name of a model endpoint (``ModelEndpoint.name``) that serves ``/embeddings``.
    embeddingEndpoint: str = ""
    embeddingModel: str = ""


class PatternPolicy(_StrictPolicyModel):
    concurrency: int | None = Field(default=None, ge=1, le=10_000)
    maxAttempts: int = Field(default=5, ge=1, le=50)
    lockWaitTimeoutSeconds: int = Field(default=3600, ge=1)
    budgets: Budgets = Budgets()
    circuitBreaker: CircuitBreakerPolicy = CircuitBreakerPolicy()
    approvals: ApprovalPolicy = ApprovalPolicy()
    toolLoop: ToolLoopPolicy = ToolLoopPolicy()
    requiredChecks: list[str] = []
    #: The pattern's layer of the harness compilation (same schema as a profile's settings;
    #: its ``paths`` section holds the pattern's denied paths and file limit).
    harness: dict[str, Any] = {}
    semanticCache: SemanticCachePolicy = SemanticCachePolicy()

    #: Moved into the harness layer (``harness.paths``); present only to say so.
    paths: Any = Field(default=None, exclude=True)

    @field_validator("paths")
    @classmethod
    def _paths_moved(cls, value: Any) -> None:
        # The old default (no limit, nothing denied) said nothing: snapshots taken before the
        # move still hold it.
        if value not in (None, {}, {"maxFiles": None, "deny": []}):
            raise ValueError("paths moved to the harness layer: write policy.harness.paths")

    #: Content safety on every model call of its runs (docs/guardrails.md): the shape of an
    #: employee's guardrails, kept in its normalized form (camelCase, defaults filled in).
    contentSafety: dict[str, Any] | None = None

    @field_validator("contentSafety", mode="before")
    @classmethod
    def _content_safety(cls, value: Any) -> dict[str, Any] | None:
        # Invalid: parse_policy reports each problem with its own pointer.
        return None if value is None else parse_guardrail_config(value).to_api()


def pydantic_errors(
    exc: ValidationError, prefix: str = "", model: type[BaseModel] | None = None
) -> list[dict[str, str]]:
    """Every problem of a pydantic error, as [{pointer, detail, code}]; with ``model``, an
    unknown key's detail lists the keys allowed there."""
    out = []
    for err in exc.errors():
        path = "/".join(str(p) for p in err["loc"])
        detail = unknown_key_detail(model, dict(err)) if model is not None else err["msg"]
        out.append(
            {
                "pointer": f"{prefix}/{path}" if path else prefix or "/",
                "detail": detail,
                "code": err["type"],
            }
        )
    return out


def parse_policy(data: Any) -> PatternPolicy:
    """Validate a pattern policy; raises InvalidInput listing every problem with its pointer."""
    try:
        return PatternPolicy.model_validate(data or {})
    except ValidationError as exc:
        errors = _with_content_safety(pydantic_errors(exc, "/policy", PatternPolicy), data)
        raise InvalidInput(
            f"The pattern policy is invalid: {errors[0]['detail']}", errors=errors
        ) from exc


def _with_content_safety(errors: list[dict[str, str]], data: Any) -> list[dict[str, str]]:
    """``errors`` with the one problem of ``contentSafety`` replaced by each of its own, under
    ``/policy/contentSafety``."""
    pointer = "/policy/contentSafety"
    if not any(e["pointer"] == pointer for e in errors) or not isinstance(data, dict):
        return errors
    own = [
        {**problem, "pointer": pointer + problem["pointer"]}
        for problem in guardrail_problems(data.get("contentSafety"))
    ]
    return [e for e in errors if e["pointer"] != pointer] + own
