"""The harness settings schema: seven sections, validated strictly, exported as JSON Schema.

Two shapes of the same settings live here:

- :class:`HarnessLayer` is what a person writes (a profile version, a pattern, an employee, a run
  override). Every section and every field is optional, because an absent key means "this layer
  has no opinion"; ``null`` is refused so there is exactly one way to say that.
- :class:`HarnessSettings` is what compilation produces: every field present, ready for the run
  engine to read without ``None`` checks.

Keys are camelCase in JSON and snake_case in Python, through pydantic aliases.
Validation is strict: unknown keys, wrong types (no ``"5"`` for 5, no ``1`` for true) and values
out of range are refused, and :func:`settings_problems` reports every problem with a JSON Pointer
to the offending field. This module is pure: no Django, no database.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from runtime.schema_keys import allowed_keys

WILDCARD = "*"
"""In a name list, ``"*"`` stands for every name."""

EFFECTS: tuple[str, ...] = ("read", "write", "external")
"""Tool effects from the least to the most severe."""
NETWORK_ACCESS: tuple[str, ...] = ("deny", "restricted", "allow")
"""Network access from the strictest to the loosest."""
ISOLATION_MODES: tuple[str, ...] = ("worktree", "none")
"""Isolation modes from the strictest to the loosest."""
MEMORY_SCOPES: tuple[str, ...] = ("agent_user", "public", "user")

EffectName = Literal["read", "write", "external"]
NetworkAccess = Literal["deny", "restricted", "allow"]
IsolationMode = Literal["none", "worktree"]
MemoryScope = Literal["public", "user", "agent_user"]

MAX_LIST_ITEMS = 2000

#: Upper bound of every number, by field path. Also the loosest value compilation starts from.
NUMBER_MAXIMA: dict[str, int | float] = {
    "memory.maxChars": 10_000_000,
    "memory.maxItems": 1000,
    "delegation.maxDepth": 10,
    "delegation.maxCount": 10_000,
    "limits.timeoutMs": 7 * 24 * 3600 * 1000,
    "limits.recursionLimit": 10_000,
    "limits.maxInvocations": 1_000_000,
    "limits.maxToolCalls": 1_000_000,
    "limits.maxTokens": 10_000_000_000,
    "limits.maxCost": 1_000_000.0,
    "limits.modelRetryWindowMs": 7 * 24 * 3600 * 1000,
    "paths.maxFiles": 1_000_000,
    "observability.tracingRetentionDays": 3650,
    "observability.samplingRate": 1.0,
}

_NAME = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}"
ToolName = Annotated[str, Field(pattern=rf"^{_NAME}$")]
NamePattern = Annotated[str, Field(pattern=rf"^(\*|{_NAME})$")]
UserPattern = Annotated[str, Field(pattern=r"^(\*|[\w.@+-]{1,150})$")]
Names = Annotated[list[NamePattern], Field(max_length=MAX_LIST_ITEMS)]
Usernames = Annotated[list[UserPattern], Field(max_length=MAX_LIST_ITEMS)]
Scopes = Annotated[list[MemoryScope], Field(max_length=len(MEMORY_SCOPES) * 4)]
Effects = Annotated[dict[ToolName, EffectName], Field(max_length=MAX_LIST_ITEMS)]
#: A path glob of ``paths.deny`` (``runtime.tools.workspace.denied_by`` syntax): no NUL, not empty.
PathGlob = Annotated[str, Field(min_length=1, max_length=500, pattern=r"^[^\x00]+$")]
PathGlobs = Annotated[list[PathGlob], Field(max_length=MAX_LIST_ITEMS)]
#: A host of ``isolation.allowedHosts``: ``"*"``, ``api.example.com`` or ``*.example.com``.
HostPattern = Annotated[
    str,
    Field(
        max_length=253,
        pattern=r"^(\*|(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
        r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*)$",
    ),
]
Hosts = Annotated[list[HostPattern], Field(max_length=MAX_LIST_ITEMS)]


def _bounded(path: str) -> Any:
    return Field(ge=0, le=NUMBER_MAXIMA[path])


MaxChars = Annotated[int, _bounded("memory.maxChars")]
MaxItems = Annotated[int, _bounded("memory.maxItems")]
MaxDepth = Annotated[int, _bounded("delegation.maxDepth")]
MaxCount = Annotated[int, _bounded("delegation.maxCount")]
MaxFiles = Annotated[int, _bounded("paths.maxFiles")]
TimeoutMs = Annotated[int, _bounded("limits.timeoutMs")]
RecursionLimit = Annotated[int, _bounded("limits.recursionLimit")]
MaxInvocations = Annotated[int, _bounded("limits.maxInvocations")]
MaxToolCalls = Annotated[int, _bounded("limits.maxToolCalls")]
MaxTokens = Annotated[int, _bounded("limits.maxTokens")]
MaxCost = Annotated[float, _bounded("limits.maxCost"), Field(allow_inf_nan=False)]
ModelRetryWindowMs = Annotated[int, _bounded("limits.modelRetryWindowMs")]
RetentionDays = Annotated[int, _bounded("observability.tracingRetentionDays")]
SamplingRate = Annotated[float, _bounded("observability.samplingRate"), Field(allow_inf_nan=False)]
MemoryEnabled = bool
MemoryWrite = bool
MemoryScopes = Scopes
Delegates = Usernames
Connectors = Names
Tracing = bool
CaptureInputs = bool
CaptureOutputs = bool


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise PydanticCustomError(
            "invalid_pattern", "not a regular expression: {error}", {"error": str(exc)}
        ) from exc
    return value


#: A pattern of ``observability.redact`` (Python ``re`` syntax): what matches is masked.
RedactPattern = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_regex)]
RedactPatterns = Annotated[list[RedactPattern], Field(max_length=50)]


def _refuse_null(value: Any) -> Any:
    if value is None:
        raise PydanticCustomError(
            "null_not_allowed", "null is not allowed: omit the key to express no opinion"
        )
    return value


T = TypeVar("T")
#: An optional layer field: may be absent (no opinion), never null.
Opt = Annotated[T | None, BeforeValidator(_refuse_null)]


class _Strict(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        frozen=True,
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
        serialize_by_alias=True,
    )


# --- Layers: what people write; every field optional -------------------------------------------


class ToolsLayer(_Strict):
    allow: Opt[Names] = Field(None, description='Tools that may run; "*" for every tool.')
    ask: Opt[Names] = Field(None, description="Tools that always need a human approval.")
    deny: Opt[Names] = Field(None, description="Tools that are never offered.")
    effects: Opt[Effects] = Field(
        None, description="Per-tool effect (read, write, external); the most severe one applies."
    )
    trusted_pre_handler_tools: Opt[Names] = Field(
        None,
        description="Allowed write/external tools that run without an approval. "
        "A profile that omits it trusts none.",
    )


class MemoryLayer(_Strict):
    enabled: Opt[MemoryEnabled] = Field(
        None,
        description="Read agent memory: the <agent_memory_context> block of the prompt and "
        "memory_search (docs/memory.md).",
    )
    write: Opt[MemoryWrite] = Field(
        None, description="Let the role save and delete memory (memory_save, memory_delete)."
    )
    scopes: Opt[MemoryScopes] = Field(
        None, description="Memory scopes the role reads and writes (public, user, agent_user)."
    )
    max_items: Opt[MaxItems] = Field(
        None, description="Most memory items injected or returned by one search."
    )
    max_chars: Opt[MaxChars] = Field(
        None, description="Characters of the injected <agent_memory_context> block at most."
    )


class DelegationLayer(_Strict):
    allowed_employees: Opt[Delegates] = Field(
        None,
        description='Employees a sub-agent task may be dispatched to (among those bound); "*" '
        "for every bound employee.",
    )
    max_depth: Opt[MaxDepth] = Field(
        None, description="Nesting depth of sub-agents: 0 none, 1 sub-agents that cannot nest."
    )
    max_count: Opt[MaxCount] = Field(
        None, description="Sub-agent tasks one invocation may dispatch."
    )


class LimitsLayer(_Strict):
    timeout_ms: Opt[TimeoutMs] = Field(
        None, description="Wall clock of an invocation and working time of the run, in ms."
    )
    recursion_limit: Opt[RecursionLimit] = Field(None, description="Model steps per invocation.")
    max_invocations: Opt[MaxInvocations] = Field(None, description="Role invocations per run.")
    max_tool_calls: Opt[MaxToolCalls] = Field(None, description="Tool calls per run.")
    max_tokens: Opt[MaxTokens] = Field(None, description="Model tokens per run.")
    max_cost: Opt[MaxCost] = Field(None, description="Model cost per run, in the endpoint's unit.")
    model_retry_window_ms: Opt[ModelRetryWindowMs] = Field(
        None,
        description="How long a run keeps retrying model calls that fail (every endpoint down, "
        "timing out or refused by its open circuit) before it fails with model_unavailable, "
        "in ms; 0: the first such failure ends the run.",
    )


class PathsLayer(_Strict):
    deny: Opt[PathGlobs] = Field(
        None,
        description="Workdir paths no file tool or bash command may read or write "
        "(globs: 'secrets/**', '*.pem').",
    )
    max_files: Opt[MaxFiles] = Field(None, description="Distinct files one invocation may write.")


class IsolationLayer(_Strict):
    mode: Opt[IsolationMode] = Field(None, description="none, or a git worktree per run.")
    require_worktree: Opt[bool] = Field(
        None, description="Refuse to run unless the run has its own worktree."
    )
    allowed_connectors: Opt[Connectors] = Field(
        None,
        description="Connectors whose tools may be offered: MCP server and A2A agent names "
        '(tools mcp__<server>__<tool>, a2a__<agent>); "*" for every registered one. A connector '
        "tool not listed is denied whatever tools.allow says.",
    )
    network_access: Opt[NetworkAccess] = Field(
        None,
        description="Network of bash, sandboxed code and MCP / A2A calls: deny, restricted "
        "(allowedHosts only) or allow.",
    )
    allowed_hosts: Opt[Hosts] = Field(
        None,
        description='Hosts a restricted network may reach ("*", "api.example.com", '
        '"*.example.com").',
    )


class ObservabilityLayer(_Strict):
    enabled: Opt[Tracing] = Field(
        None, description="Record the role's execution spans (docs/observability.md)."
    )
    tracing_retention_days: Opt[RetentionDays] = Field(
        None, description="Days a run's spans are kept after it ends; then they are pruned."
    )
    capture_inputs: Opt[CaptureInputs] = Field(
        None, description="Keep each step's input in its span (and its export)."
    )
    capture_outputs: Opt[CaptureOutputs] = Field(
        None, description="Keep each step's output in its span (and its export)."
    )
    redact: Opt[RedactPatterns] = Field(
        None,
        description='Regular expressions whose matches are replaced by "***" before they are '
        "stored or exported: in the role's steps (prompts, responses, tool calls and results), "
        "its outcome, and its spans' captured input and output.",
    )
    sampling_rate: Opt[SamplingRate] = Field(
        None,
        description="Fraction of runs (0.0-1.0, by trace id) whose spans for this role are "
        "recorded, shown and exported; the others have none.",
    )


class HarnessLayer(_Strict):
    """One layer of harness settings (a profile version, pattern, employee or run override)."""

    model_config = ConfigDict(title="Loopwright harness settings")

    tools: Opt[ToolsLayer] = None
    memory: Opt[MemoryLayer] = None
    delegation: Opt[DelegationLayer] = None
    limits: Opt[LimitsLayer] = None
    paths: Opt[PathsLayer] = None
    isolation: Opt[IsolationLayer] = None
    observability: Opt[ObservabilityLayer] = None


# --- Compiled settings: every field present ------------------------------------------------------


class ToolsSettings(_Strict):
    allow: Names
    ask: Names
    deny: Names
    effects: Effects
    trusted_pre_handler_tools: Names


class MemorySettings(_Strict):
    enabled: MemoryEnabled
    scopes: MemoryScopes
    max_chars: MaxChars
    # Snapshots compiled before memory was built had it off; neither field existed then.
    write: MemoryWrite = False
    max_items: MaxItems = 0


class DelegationSettings(_Strict):
    allowed_employees: Delegates
    max_depth: MaxDepth
    max_count: MaxCount


class LimitsSettings(_Strict):
    timeout_ms: TimeoutMs
    recursion_limit: RecursionLimit
    max_invocations: MaxInvocations
    max_tool_calls: MaxToolCalls
    max_tokens: MaxTokens
    max_cost: MaxCost
    model_retry_window_ms: ModelRetryWindowMs


class PathsSettings(_Strict):
    deny: PathGlobs
    max_files: MaxFiles


class IsolationSettings(_Strict):
    mode: IsolationMode
    require_worktree: bool
    allowed_connectors: Connectors
    network_access: NetworkAccess
    allowed_hosts: Hosts


class ObservabilitySettings(_Strict):
    enabled: Tracing
    tracing_retention_days: RetentionDays
    capture_inputs: CaptureInputs
    capture_outputs: CaptureOutputs
    redact: RedactPatterns
    # Snapshots compiled before sampling existed recorded every run.
    sampling_rate: SamplingRate = 1.0


class HarnessSettings(_Strict):
    """Compiled (complete) harness settings, as stored in a run's snapshot."""

    tools: ToolsSettings
    memory: MemorySettings
    delegation: DelegationSettings
    limits: LimitsSettings
    paths: PathsSettings
    isolation: IsolationSettings
    observability: ObservabilitySettings


DEFAULT_PLATFORM: dict[str, dict[str, Any]] = {
    "tools": {
        "allow": ["*"],
        "ask": [],
        "deny": [],
        "effects": {},
        "trustedPreHandlerTools": ["*"],
    },
    "memory": {
        "enabled": True,
        "write": True,
        "scopes": ["agent_user", "public", "user"],
        "maxItems": 20,
        "maxChars": 4000,
    },
    "delegation": {"allowedEmployees": ["*"], "maxDepth": 1, "maxCount": 10},
    "limits": {
        "timeoutMs": 4 * 3600 * 1000,
        "recursionLimit": 200,
        "maxInvocations": 500,
        "maxToolCalls": 5000,
        "maxTokens": 2_000_000,
        "maxCost": 100.0,
        "modelRetryWindowMs": 30 * 60 * 1000,
    },
    "paths": {"deny": [], "maxFiles": 10_000},
    "isolation": {
        "mode": "none",
        "requireWorktree": False,
        "allowedConnectors": ["*"],
        "networkAccess": "allow",
        "allowedHosts": ["*"],
    },
    "observability": {
        "enabled": True,
        "tracingRetentionDays": 30,
        "captureInputs": True,
        "captureOutputs": True,
        "redact": [],
        "samplingRate": 1.0,
    },
}
"""Platform ceilings when ``settings.LOOPWRIGHT_HARNESS_PLATFORM`` does not override them:
permissive about names (profiles decide those) and bounded in every number."""


# --- Problems ---------------------------------------------------------------------------------


class SettingsProblem(TypedDict):
    pointer: str
    detail: str
    code: str


class SettingsInvalid(ValueError):
    """Settings that do not fit the schema; ``problems`` lists every one of them."""

    def __init__(self, problems: list[SettingsProblem]) -> None:
        super().__init__(f"{len(problems)} problem(s) in harness settings")
        self.problems = problems


def json_pointer(path: Sequence[str | int]) -> str:
    """RFC 6901 pointer of a path (``~`` and ``/`` escaped)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _problem(error: Mapping[str, Any], prefix: Sequence[str | int]) -> SettingsProblem:
    loc = list(error["loc"])
    detail, code = str(error["msg"]), str(error["type"])
    if loc and loc[-1] == "[key]":
        loc.pop()
        detail = f"key {loc[-1]!r}: {detail}"
    elif code == "extra_forbidden":
        allowed = allowed_keys(HarnessLayer, loc[:-1])
        known = f": allowed keys are {', '.join(allowed)}" if allowed else ""
        detail, code = f"unknown key {loc[-1]!r}{known}", "unknown_key"
    elif code == "model_type":
        detail = "expected an object"
    return {"pointer": json_pointer([*prefix, *loc]), "detail": detail, "code": code}


def problems_of(exc: ValidationError, prefix: Sequence[str | int] = ()) -> list[SettingsProblem]:
    """Every error of a pydantic validation as ``{pointer, detail, code}``."""
    return [_problem(error, prefix) for error in exc.errors(include_url=False)]


def settings_problems(data: Any, prefix: Sequence[str | int] = ()) -> list[SettingsProblem]:
    """Every problem of ``data`` as layer settings (empty when valid)."""
    try:
        HarnessLayer.model_validate(data)
    except ValidationError as exc:
        return problems_of(exc, prefix)
    return []


def layer_validate(data: Any, prefix: Sequence[str | int] = ()) -> HarnessLayer:
    """Parse layer settings, raising :class:`SettingsInvalid` with every problem."""
    try:
        return HarnessLayer.model_validate(data)
    except ValidationError as exc:
        raise SettingsInvalid(problems_of(exc, prefix)) from exc


# --- JSON Schema ------------------------------------------------------------------------------

JSON_SCHEMA_PATH = Path(__file__).with_name("settings.schema.json")
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
JSON_SCHEMA_ID = "https://loopwright.dev/schemas/harness-settings.json"


class _LayerJsonSchema(GenerateJsonSchema):
    """Optional fields are absent rather than null, so the schema shows neither null nor default."""

    key_patterns = True

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        if schema.get("default") is None:
            return self.generate_inner(schema["schema"])
        return super().default_schema(schema)

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def dict_schema(self, schema: core_schema.DictSchema) -> JsonSchemaValue:
        # pydantic writes constrained keys as patternProperties, which lets other keys through;
        # propertyNames refuses them as the validator does.
        out = super().dict_schema(schema)
        patterns = out.pop("patternProperties", None)
        if patterns:
            ((pattern, values),) = patterns.items()
            out["additionalProperties"] = values
            if self.key_patterns:
                out["propertyNames"] = {"pattern": pattern}
        return out


class _OpenApiJsonSchema(_LayerJsonSchema):
    """OpenAPI 3.0 schema objects have no ``propertyNames``; the validator still checks keys."""

    key_patterns = False


def export_json_schema() -> dict[str, Any]:
    """The JSON Schema (Draft 2020-12) of layer settings, as committed in settings.schema.json."""
    schema = HarnessLayer.model_json_schema(by_alias=True, schema_generator=_LayerJsonSchema)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": JSON_SCHEMA_ID,
        **schema,
    }


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A model's JSON Schema with definitions inlined, for an OpenAPI component."""
    schema = model.model_json_schema(by_alias=True, schema_generator=_OpenApiJsonSchema)
    return dict(inline_refs(schema))


def json_schema_text() -> str:
    return json.dumps(export_json_schema(), indent=2, sort_keys=True) + "\n"


def inline_refs(schema: Any, defs: Mapping[str, Any] | None = None) -> Any:
    """The schema with every local ``$ref`` replaced by its definition (the schema is acyclic).

    OpenAPI components cannot hold JSON Schema ``$defs``, so the API documents this form.
    """
    if defs is None and isinstance(schema, dict):
        defs = schema.get("$defs", {})
    if isinstance(schema, dict):
        ref = schema.get("$ref", "")
        if ref.startswith("#/$defs/"):
            return inline_refs(dict((defs or {})[ref.removeprefix("#/$defs/")]), defs)
        skip = {"$defs", "$schema", "$id"}
        return {k: inline_refs(v, defs) for k, v in schema.items() if k not in skip}
    if isinstance(schema, list):
        return [inline_refs(item, defs) for item in schema]
    return schema


if __name__ == "__main__":  # python -m harness.schema rewrites the committed schema file
    JSON_SCHEMA_PATH.write_text(json_schema_text())
