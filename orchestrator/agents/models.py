"""Model endpoints, their failover routes, and the AI employees that call them.

API keys are never stored: an endpoint names the environment variable that holds its key
(``api_key_env``) and the runtime reads it at call time. ``params`` columns hold the camelCase
parameters of docs/model-client.md, validated by :class:`runtime.model_config.ModelParams`.
"""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import F, Q
from pydantic import ValidationError as PydanticValidationError

from orchestrator.guard import endpoint_problems
from runtime.model_config import ModelParams
from runtime.scripted import load_script

ENV_NAME_VALIDATOR = RegexValidator(
    r"^[A-Za-z_][A-Za-z0-9_]*$", "Use an environment variable name such as OPENAI_API_KEY."
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Provider(models.TextChoices):
    OPENAI = "openai", "OpenAI-compatible HTTP endpoint"
    SCRIPTED = "scripted", "Offline scripted model"


class StreamToolCallCheck(models.TextChoices):
    # Values are spelled as in docs/model-client.md, which operators copy from.
    AUTO = "auto", "auto (500 ms observation window)"
    FIRST_CONTENT = "firstContent", "firstContent (first text decides)"
    DRAIN = "drain", "drain (read the whole stream first)"


def params_errors(data: object) -> dict[str, list[str]]:
    """Field → messages for invalid ``params`` (empty when valid)."""
    try:
        ModelParams.model_validate(data)
    except PydanticValidationError as exc:
        errors: dict[str, list[str]] = {}
        for error in exc.errors():
            field = ".".join(str(part) for part in error["loc"]) or "params"
            errors.setdefault(field, []).append(f"{field}: {error['msg']}")
        return errors
    return {}


def _validate_params(value: object) -> None:
    errors = params_errors(value)
    if errors:
        raise ValidationError([message for messages in errors.values() for message in messages])


class ModelEndpoint(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    provider = models.CharField(max_length=20, choices=Provider.choices, default=Provider.OPENAI)
    base_url = models.URLField(max_length=500, blank=True, default="")
    model = models.CharField(max_length=200, blank=True, default="")
    api_key_env = models.CharField(
        max_length=100, blank=True, default="", validators=[ENV_NAME_VALIDATOR]
    )
    #: For the scripted provider: a built-in script name (``demo``) or an absolute JSON path.
    script = models.CharField(max_length=500, blank=True, default="")
    params = models.JSONField(default=dict, blank=True, validators=[_validate_params])
    context_window = models.PositiveIntegerField(default=128_000)
    input_price_per_token = models.DecimalField(max_digits=20, decimal_places=12, default=0)
    output_price_per_token = models.DecimalField(max_digits=20, decimal_places=12, default=0)
    max_retries = models.PositiveSmallIntegerField(default=3)
    timeout_seconds = models.FloatField(default=60.0)
    circuit_cooldown_seconds = models.PositiveIntegerField(default=60)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "model endpoint"
        constraints = [
            models.CheckConstraint(
                condition=Q(provider__in=Provider.values), name="agents_endpoint_provider_valid"
            ),
            models.CheckConstraint(
                condition=Q(provider=Provider.SCRIPTED) | (~Q(base_url="") & ~Q(model="")),
                name="agents_endpoint_http_needs_url_and_model",
                violation_error_message="An HTTP endpoint needs a base URL and a model.",
            ),
            models.CheckConstraint(
                condition=Q(max_retries__lte=10), name="agents_endpoint_max_retries_range"
            ),
            models.CheckConstraint(
                condition=Q(timeout_seconds__gt=0), name="agents_endpoint_timeout_positive"
            ),
            models.CheckConstraint(
                condition=Q(circuit_cooldown_seconds__gte=1),
                name="agents_endpoint_cooldown_positive",
            ),
            models.CheckConstraint(
                condition=Q(context_window__gte=1), name="agents_endpoint_context_positive"
            ),
            models.CheckConstraint(
                condition=Q(input_price_per_token__gte=0) & Q(output_price_per_token__gte=0),
                name="agents_endpoint_prices_not_negative",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.provider == Provider.SCRIPTED:
            try:
                load_script(self.script or "demo")
            except ValueError as exc:
                raise ValidationError({"script": str(exc)}) from None
        # The secret rule and the outbound guard (docs/security.md); the call path checks both
        # again, for rows written before these rules or past this method.
        problems = endpoint_problems(
            provider=self.provider,
            base_url=self.base_url,
            # A name the field's own validator refuses gets that message alone.
            api_key_env=self.api_key_env if _ENV_NAME.match(self.api_key_env or "") else "",
        )
        if problems:
            raise ValidationError(problems)


class FailoverRoute(models.Model):
    """``source`` fails over to ``target`` (lower ``priority`` first), optionally overriding
    the model and some parameters for that hop."""

    source = models.ForeignKey(
        ModelEndpoint, on_delete=models.CASCADE, related_name="failover_routes"
    )
    # PROTECT: deleting an endpoint that others fail over to must be a deliberate two-step.
    target = models.ForeignKey(ModelEndpoint, on_delete=models.PROTECT, related_name="failover_for")
    priority = models.PositiveSmallIntegerField()
    model = models.CharField(max_length=200, blank=True, default="")
    params = models.JSONField(default=dict, blank=True, validators=[_validate_params])

    class Meta:
        ordering = ["source", "priority"]
        constraints = [
            models.UniqueConstraint(fields=["source", "priority"], name="agents_failover_priority"),
            models.UniqueConstraint(fields=["source", "target"], name="agents_failover_once"),
            models.CheckConstraint(
                condition=~Q(source=F("target")), name="agents_failover_not_self"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.source_id} → {self.target_id} ({self.priority})"

    def clean(self) -> None:
        # The HTTP client walks the chain, so every hop must be an HTTP endpoint.
        if self.source_id is not None and self.source.provider != Provider.OPENAI:
            raise ValidationError("Only OpenAI-compatible endpoints have failover routes.")
        if self.target_id is None:
            return
        if self.target_id == self.source_id:
            raise ValidationError({"target": "An endpoint cannot fail over to itself."})
        if self.target.provider != Provider.OPENAI:
            raise ValidationError({"target": "Failover targets must be HTTP endpoints."})


class Employee(models.Model):
    """An AI employee: a username with a model endpoint, a system prompt, limits and tools."""

    username = models.SlugField(max_length=150, unique=True)
    display_name = models.CharField(max_length=200, blank=True, default="")
    endpoint = models.ForeignKey(ModelEndpoint, on_delete=models.PROTECT, related_name="employees")
    system_prompt = models.TextField(blank=True, default="")
    #: Overrides of the endpoint's parameters for this employee (same shape).
    params = models.JSONField(default=dict, blank=True, validators=[_validate_params])
    max_steps = models.PositiveSmallIntegerField(default=12)
    #: Tool names; the harness decides what may actually run.
    tools = models.JSONField(default=list, blank=True)
    tool_concurrency = models.PositiveSmallIntegerField(default=4)
    tool_timeout_seconds = models.FloatField(default=60.0)
    max_tool_output_length = models.PositiveIntegerField(default=50_000)
    streaming = models.BooleanField(default=False)
    stream_tool_call_check = models.CharField(
        max_length=20, choices=StreamToolCallCheck.choices, default=StreamToolCallCheck.AUTO
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["username"]
        verbose_name = "AI employee"
        constraints = [
            models.CheckConstraint(
                condition=Q(max_steps__gte=1) & Q(max_steps__lte=1000),
                name="agents_employee_max_steps_range",
            ),
            models.CheckConstraint(
                condition=Q(tool_concurrency__gte=1) & Q(tool_concurrency__lte=64),
                name="agents_employee_tool_concurrency_range",
            ),
            models.CheckConstraint(
                condition=Q(tool_timeout_seconds__gt=0),
                name="agents_employee_tool_timeout_positive",
            ),
            models.CheckConstraint(
                condition=Q(max_tool_output_length__gte=1),
                name="agents_employee_tool_output_positive",
            ),
            models.CheckConstraint(
                condition=Q(stream_tool_call_check__in=StreamToolCallCheck.values),
                name="agents_employee_stream_check_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.username


class EndpointCircuit(models.Model):
    """A model endpoint's breaker (key ``model-endpoint:<name>``), shared by every process:
    the database store of :class:`runtime.breaker.CircuitBreaker` when no Redis is configured."""

    key = models.CharField(max_length=200, unique=True)
    state = models.CharField(max_length=10, default="closed")
    consecutive_failures = models.PositiveIntegerField(default=0)
    opened_at = models.DateTimeField(null=True, blank=True)
    cooldown_seconds = models.PositiveIntegerField(default=60)
    probe_owner = models.CharField(max_length=200, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.key}:{self.state}"


__all__ = [
    "Employee",
    "EndpointCircuit",
    "FailoverRoute",
    "ModelEndpoint",
    "Provider",
    "StreamToolCallCheck",
    "params_errors",
]
