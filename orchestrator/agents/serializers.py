"""API shapes of model endpoints and AI employees.

Responses never contain an API key: only ``api_key_env`` (the variable's name) and
``api_key_configured`` (whether that variable is allowed and set in this process). A request
that tries to send a key is refused rather than silently ignored, so nobody believes it was
stored. The secret rule and the outbound guard are checked when the row is saved (the model's
``clean``, run by the services), so the API, the admin and commands refuse alike.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import URLValidator
from drf_spectacular.utils import extend_schema_field
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError
from rest_framework import serializers

from harness.serializers import HarnessLayerField
from orchestrator.agents.models import (
    Employee,
    FailoverRoute,
    ModelAlias,
    ModelEndpoint,
    SubAgentBinding,
    preset_message_problems,
)
from orchestrator.agents.routing import RULES_SCHEMA
from orchestrator.strict import StrictModelSerializer
from runtime import outbound
from runtime.model_config import ModelParams
from runtime.prompt_template import PromptTemplateError, check_prompt_template
from runtime.schema_keys import unknown_key_detail
from runtime.secrets import api_key_configured

TOOL_NAME = r"^[A-Za-z0-9_.:-]{1,128}$"
KEY_FIELDS = ("api_key", "apiKey", "key")
MAX_SECONDS = 86_400  # a timeout beyond a day is a typo, and 1e308 s overflows every clock


def _openapi(schema: Any) -> Any:
    """pydantic's JSON Schema → OpenAPI 3.0 (``anyOf [X, null]`` becomes ``X, nullable``)."""
    if isinstance(schema, list):
        return [_openapi(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _openapi(value) for key, value in schema.items()}
    options = out.get("anyOf")
    if isinstance(options, list) and {"type": "null"} in options:
        rest = [option for option in options if option != {"type": "null"}]
        out.pop("anyOf")
        out.update(rest[0] if len(rest) == 1 else {"anyOf": rest})
        out["nullable"] = True
    return out


PARAMS_SCHEMA = _openapi(ModelParams.model_json_schema(by_alias=True))


@extend_schema_field(PARAMS_SCHEMA)
class ModelParamsField(serializers.Field[Any, Any, dict[str, Any], Any]):
    """The endpoint's ``params`` (docs/model-client.md), validated by pydantic; errors point
    at the offending parameter."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> ModelParams:
        if not isinstance(data, dict):
            raise serializers.ValidationError("Expected an object of parameters.")
        try:
            return ModelParams.model_validate(data)
        except PydanticValidationError as exc:
            raise serializers.ValidationError(_pydantic_errors(exc, ModelParams)) from None

    def to_representation(self, value: Any) -> dict[str, Any]:
        return dict(value or {})


_TEXT = {
    "type": "object",
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
_IMAGE = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": ["image_url"]},
        "image_url": {
            "type": "object",
            "properties": {"url": {"type": "string"}},
            "required": ["url"],
        },
    },
    "required": ["type", "image_url"],
}


@extend_schema_field(
    {
        "type": "array",
        "maxItems": 50,
        "items": {
            "type": "object",
            "properties": {
                "role": {"type": "string", "enum": ["user", "assistant", "system"]},
                "content": {
                    "oneOf": [
                        {"type": "string"},
                        {"type": "array", "minItems": 1, "items": {"oneOf": [_TEXT, _IMAGE]}},
                    ]
                },
            },
            "required": ["role", "content"],
            "additionalProperties": False,
        },
    }
)
class PresetMessagesField(serializers.JSONField):
    """An employee's few-shot messages (checked by ``validate_preset_messages``)."""


def _pydantic_errors(
    exc: PydanticValidationError, model: type[BaseModel] | None = None
) -> dict[str, list[str]] | list[str]:
    errors: dict[str, list[str]] = {}
    general: list[str] = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        message = unknown_key_detail(model, dict(error)) if model is not None else error["msg"]
        if not loc:
            general.append(message.removeprefix("Value error, "))
            continue
        errors.setdefault(loc[0], []).append(f"{'.'.join(loc)}: {message}")
    return errors or general


def _refuse_keys(data: Any) -> None:
    if isinstance(data, dict) and any(field in data for field in KEY_FIELDS):
        raise serializers.ValidationError(
            {"api_key": "API keys are not accepted; set api_key_env to an environment variable."}
        )


class FailoverRouteSerializer(StrictModelSerializer[FailoverRoute]):
    endpoint = serializers.SlugRelatedField(
        source="target", slug_field="name", queryset=ModelEndpoint.objects.all()
    )
    params = ModelParamsField(help_text="Parameter overrides for this hop.")

    class Meta:
        model = FailoverRoute
        fields = ["endpoint", "model", "params"]
        extra_kwargs = {"model": {"help_text": "Model override; empty keeps the target's."}}


def _guard_base_url(value: str) -> None:
    """The outbound guard's static checks first, so that a hostile URL is refused with the
    rule (not only "Enter a valid URL."); its addresses are checked when the row is saved."""
    if not value:
        return
    try:
        outbound.check_url(value, outbound.current_policy())
    except outbound.OutboundRefused as exc:
        raise serializers.ValidationError(f"base_url refused: {exc}") from None
    try:
        URLValidator()(value)
    except DjangoValidationError:
        raise serializers.ValidationError("Enter a valid URL.") from None


class ModelEndpointSerializer(StrictModelSerializer[ModelEndpoint]):
    api_key_configured = serializers.SerializerMethodField(
        help_text="Whether the api_key_env variable is allowed and set in this server process."
    )
    base_url = serializers.CharField(
        max_length=500,
        allow_blank=True,
        required=False,
        validators=[_guard_base_url],
        help_text="http(s) URL ending in /v1; checked by the outbound guard (docs/security.md) "
        "when saved and on every connection.",
    )
    params = ModelParamsField()
    failover = FailoverRouteSerializer(
        source="failover_routes", many=True, required=False, help_text="In priority order."
    )

    class Meta:
        model = ModelEndpoint
        fields = [
            "name",
            "provider",
            "base_url",
            "model",
            "api_key_env",
            "api_key_configured",
            "script",
            "params",
            "context_window",
            "input_price_per_token",
            "output_price_per_token",
            "max_retries",
            "timeout_seconds",
            "circuit_cooldown_seconds",
            "vision",
            "failover",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["created_at", "updated_at"]
        extra_kwargs = {
            "api_key_env": {
                "help_text": "Name of the environment variable holding the key: it must start "
                "with LOOPWRIGHT_SECRET_ (LOOPWRIGHT_SECRET_PREFIX) or be listed in "
                "LOOPWRIGHT_SECRET_ALLOW, and never be one of the server's own variables."
            },
            "max_retries": {"min_value": 0, "max_value": 10},
            "timeout_seconds": {"min_value": 0.001, "max_value": MAX_SECONDS},
            "circuit_cooldown_seconds": {"min_value": 1},
            "vision": {
                "help_text": "The model accepts image content parts: a run's `inputs.images` "
                "are sent to it. Off: a run given images fails before any model call."
            },
            "context_window": {"min_value": 1},
            "input_price_per_token": {"min_value": 0},
            "output_price_per_token": {"min_value": 0},
        }

    def get_api_key_configured(self, endpoint: ModelEndpoint) -> bool:
        return api_key_configured(endpoint.api_key_env)

    def to_internal_value(self, data: Any) -> Any:
        _refuse_keys(data)
        return super().to_internal_value(data)


class EmployeeSerializer(StrictModelSerializer[Employee]):
    endpoint = serializers.SlugRelatedField(
        slug_field="name",
        queryset=ModelEndpoint.objects.all(),
        help_text="Model endpoint name: every model call, or with a model alias the calls no "
        "alias rule matches.",
    )
    model_alias = serializers.SlugRelatedField(
        slug_field="name",
        queryset=ModelAlias.objects.all(),
        required=False,
        allow_null=True,
        help_text="A model alias routing this employee's calls by pattern, role and cost "
        "ceiling (docs/model-routing.md); null: always `endpoint`.",
    )
    params = ModelParamsField(help_text="Overrides of the endpoint's parameters.")
    tools = serializers.ListField(
        child=serializers.RegexField(TOOL_NAME), required=False, help_text="Tool names."
    )
    harness_tag = serializers.CharField(
        max_length=120,
        required=False,
        allow_blank=True,
        help_text=(
            "A published harness profile (`tag` or `tag@N`) stacked on this employee's runs after "
            "the pattern's layer, as layer `employee:<username>:profile:<tag>@<N>`; blank: none."
        ),
    )
    harness = HarnessLayerField(
        required=False,
        help_text=(
            "Inline harness layer settings (as a profile's), stacked on this employee's runs as "
            "layer `employee:<username>`; `{}`: none. Problems point into it "
            "(`/harness/limits/maxTokens`)."
        ),
    )
    preset_messages = PresetMessagesField(
        required=False,
        help_text=(
            "Few-shot messages `[{role: user|assistant|system, content}]` (content: a string or "
            "OpenAI content parts), sent after the system prompt and before a run's goal (a "
            "chat: after the client's leading system messages). At most 50, 100,000 "
            "characters in all; problems point into it (`/preset_messages/1/role`)."
        ),
    )

    class Meta:
        model = Employee
        fields = [
            "username",
            "display_name",
            "endpoint",
            "model_alias",
            "system_prompt",
            "params",
            "max_steps",
            "tools",
            "tool_concurrency",
            "tool_timeout_seconds",
            "max_tool_output_length",
            "streaming",
            "stream_tool_call_check",
            "stream_retry_mode",
            "preset_messages",
            "daily_token_quota",
            "daily_cost_quota",
            "harness_tag",
            "harness",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["created_at", "updated_at"]
        extra_kwargs = {
            "max_steps": {"min_value": 1, "max_value": 1000},
            "system_prompt": {
                "help_text": "Above the role's default prompt. Placeholders: "
                "`${instructions.name}` / `${instructions.name@3}` (pinned when a run starts), "
                '`${include("path")}` (a workspace file), `${inputs.x}`; `$${` is a literal '
                "`${`. See docs/prompts.md."
            },
            "tool_concurrency": {"min_value": 1, "max_value": 64},
            "tool_timeout_seconds": {"min_value": 0.001, "max_value": MAX_SECONDS},
            "max_tool_output_length": {"min_value": 1},
            "streaming": {
                "help_text": "Stream every model request of this employee's runs; the text shows "
                "live on the run page; what is persisted is the same."
            },
            "stream_tool_call_check": {
                "help_text": "How a stream's tool calls are detected: auto, firstContent or "
                "drain; see docs/model-client.md."
            },
            "daily_token_quota": {
                "min_value": 1,
                "help_text": "The most tokens (prompt + completion) the employee's model calls "
                "may use per UTC day, its runs and chats together; null: no quota. A run out of "
                "quota stops with a budget stop naming it; a chat answers 429 with Retry-After.",
            },
            "daily_cost_quota": {
                "min_value": 0,
                "help_text": "The same for cost (the endpoint's prices); null: no quota.",
            },
            "stream_retry_mode": {
                "help_text": "off: a stream that fails after its first text is not retried "
                "(text shows live); full: the stream is buffered and retried from the start "
                "on a mid-stream failure (its text is released only when it is whole)."
            },
        }

    def validate_tools(self, tools: list[str]) -> list[str]:
        if len(set(tools)) != len(tools):
            raise serializers.ValidationError("Each tool may be listed once.")
        return tools

    def validate_preset_messages(self, messages: Any) -> Any:
        problems = preset_message_problems(messages)
        if not problems:
            return messages
        nested: dict[str, Any] = {}
        general: list[str] = []
        for path, detail in problems:
            if not path:
                general.append(detail)
                continue
            node = nested
            for part in path[:-1]:
                node = node.setdefault(str(part), {})
            node.setdefault(str(path[-1]), []).append(detail)
        raise serializers.ValidationError(nested if nested else general)

    def validate_system_prompt(self, prompt: str) -> str:
        """Placeholders parse (docs/prompts.md); what they name is resolved when a run starts."""
        try:
            check_prompt_template(prompt)
        except PromptTemplateError as exc:
            raise serializers.ValidationError(str(exc)) from exc
        return prompt


class SubAgentBindingSerializer(StrictModelSerializer[SubAgentBinding]):
    """A sub-agent binding of the employee in the URL (docs/sub-agents.md)."""

    child = serializers.SlugRelatedField(
        slug_field="username",
        queryset=Employee.objects.all(),
        help_text="The employee that may receive the parent's sub-agent tasks.",
    )
    endpoint = serializers.SlugRelatedField(
        slug_field="name",
        queryset=ModelEndpoint.objects.all(),
        required=False,
        allow_null=True,
        help_text="Model endpoint override for the child when it runs for this parent; "
        "null: the child's own.",
    )
    alternatives = serializers.ListField(
        child=serializers.SlugField(max_length=150),
        required=False,
        max_length=10,
        help_text="Usernames of employees tried in order when the child's model fails.",
    )

    class Meta:
        model = SubAgentBinding
        fields = ["child", "endpoint", "model", "alternatives", "created_at"]
        read_only_fields = ["created_at"]
        extra_kwargs = {
            "model": {"help_text": "Model name override (on the endpoint used); blank: keep."}
        }


@extend_schema_field(_openapi(RULES_SCHEMA))
class AliasRulesField(serializers.JSONField):
    """An alias's rules (checked by the services, with pointers into them)."""


class ModelAliasSerializer(StrictModelSerializer[ModelAlias]):
    """A model alias (docs/model-routing.md)."""

    rules = AliasRulesField(
        required=False,
        help_text="Ordered rules `{patterns, roles, max_price_per_million_tokens, targets}`: the "
        "first that matches a call's pattern and role and has a target within its ceiling "
        "routes it to its targets (in order: the next ones when one fails or its circuit "
        "breaker is open). No rule matching: the employee's own endpoint.",
    )
    employees: serializers.SlugRelatedField[Employee] = serializers.SlugRelatedField(
        many=True, read_only=True, slug_field="username", help_text="Employees routed by it."
    )

    class Meta:
        model = ModelAlias
        fields = [
            "name",
            "description",
            "rules",
            "employees",
            "created_at",
            "updated_at",
            "updated_by",
        ]
        read_only_fields = ["created_at", "updated_at", "updated_by"]
