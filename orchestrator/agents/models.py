"""Model endpoints, their failover routes, and the AI employees that call them.

An employee may carry its own harness layers (docs/harness.md): ``harness_tag`` names a
published profile (``tag`` or ``tag@N``) and ``harness`` holds inline layer settings; a run stacks
both after the pattern's layer, so they can only tighten what the employee may do.

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

from harness.schema import SettingsInvalid, layer_validate
from harness.services import harness_tag_exists
from orchestrator.agents.routing import alias_rule_problems, parse_rules, rule_targets
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


class StreamRetryMode(models.TextChoices):
    OFF = "off", "off (retry only before the first text; live text)"
    FULL = "full", "full (buffer the stream; retry it whole on a mid-stream failure)"


PRESET_ROLES = ("user", "assistant", "system")
MAX_PRESET_MESSAGES = 50
MAX_PRESET_CHARS = 100_000


def _content_chars(content: object) -> int | None:
    """Characters of a message's content (a string or OpenAI content parts); None: malformed."""
    if isinstance(content, str):
        return len(content)
    if not isinstance(content, list) or not content:
        return None
    total = 0
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in ("text", "image_url"):
            return None
        if part["type"] == "text" and isinstance(part.get("text"), str):
            total += len(part["text"])
        elif part["type"] == "image_url" and isinstance(part.get("image_url"), dict):
            total += len(str(part["image_url"].get("url") or ""))
        else:
            return None
    return total


def preset_message_problems(value: object) -> list[tuple[tuple[str | int, ...], str]]:
    """Every problem of an employee's ``preset_messages`` as (path inside the field, message):
    a list of at most 50 ``{role, content}`` (role user / assistant / system; content a string
    or an OpenAI content-part array), 100,000 characters in all."""
    if not isinstance(value, list):
        return [((), "A list of {role, content} messages.")]
    if len(value) > MAX_PRESET_MESSAGES:
        return [((), f"At most {MAX_PRESET_MESSAGES} preset messages.")]
    problems: list[tuple[tuple[str | int, ...], str]] = []
    total = 0
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            problems.append(((index,), "An object {role, content}."))
            continue
        extra = sorted(set(message) - {"role", "content"})
        if extra:
            problems.append(((index, extra[0]), "Unknown field; a message has role and content."))
        if message.get("role") not in PRESET_ROLES:
            problems.append(((index, "role"), "One of user, assistant, system."))
        chars = _content_chars(message.get("content"))
        if chars is None:
            problems.append(
                ((index, "content"), "A string or an array of text / image_url content parts.")
            )
        total += chars or 0
    if not problems and total > MAX_PRESET_CHARS:
        problems.append(((), f"At most {MAX_PRESET_CHARS:,} characters in all ({total:,} given)."))
    return problems


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
    #: The model accepts image content parts (a run's ``inputs.images`` are sent to it).
    vision = models.BooleanField(default=False)
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


class ModelAlias(models.Model):
    """A name employees route their model calls by: ordered rules choosing an endpoint chain by
    pattern, role and cost ceiling (``routing.AliasRule``; docs/model-routing.md)."""

    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True, default="")
    #: ``[{patterns, roles, max_price_per_million_tokens, targets}]``, first match wins.
    rules = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        ordering = ["name"]
        verbose_name = "model alias"
        verbose_name_plural = "model aliases"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        problems = alias_problems(self.rules)
        if problems:
            raise ValidationError(
                {"rules": [f"{'.'.join(map(str, path))}: {detail}" for path, detail in problems]}
            )


def alias_problems(rules: object) -> list[tuple[tuple[str | int, ...], str]]:
    """The rules' schema problems, then every target that names no endpoint (with its path)."""
    problems = alias_rule_problems(rules)
    if problems or not isinstance(rules, list):
        return problems
    parsed = parse_rules(rules)
    known = set(
        ModelEndpoint.objects.filter(name__in=rule_targets(parsed)).values_list("name", flat=True)
    )
    return [
        ((index, "targets", position), f"No model endpoint named {name}.")
        for index, rule in enumerate(parsed)
        for position, name in enumerate(rule.targets)
        if name not in known
    ]


def employee_harness_problems(harness_tag: str, harness: object) -> list[dict[str, str]]:
    """Every problem of an employee's harness fields as ``{pointer, detail, code}``:
    ``/harness_tag`` when it names no published profile, ``/harness/<section>/<key>`` for the
    inline layer (validated by :func:`harness.schema.layer_validate`)."""
    problems: list[dict[str, str]] = []
    if harness_tag and not harness_tag_exists(harness_tag):
        detail = f"{harness_tag!r} names no published harness profile ('tag' or 'tag@N')."
        problems.append({"pointer": "/harness_tag", "detail": detail, "code": "unknown_profile"})
    try:
        layer_validate(harness, ("harness",))
    except SettingsInvalid as exc:
        for found in exc.problems:
            problems.append(
                {"pointer": found["pointer"], "detail": found["detail"], "code": found["code"]}
            )
    return problems


class Employee(models.Model):
    """An AI employee: a username with a model endpoint, a system prompt, limits and tools."""

    username = models.SlugField(max_length=150, unique=True)
    display_name = models.CharField(max_length=200, blank=True, default="")
    endpoint = models.ForeignKey(ModelEndpoint, on_delete=models.PROTECT, related_name="employees")
    #: Routes the employee's model calls by the alias's rules; a call no rule matches uses
    #: ``endpoint``. Null: always ``endpoint``.
    model_alias = models.ForeignKey(
        ModelAlias, null=True, blank=True, on_delete=models.PROTECT, related_name="employees"
    )
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
    stream_retry_mode = models.CharField(
        max_length=10, choices=StreamRetryMode.choices, default=StreamRetryMode.OFF
    )
    #: Few-shot messages sent after the system prompt, before the goal or the chat.
    preset_messages = models.JSONField(default=list, blank=True)
    #: A published harness profile (``tag`` or ``tag@N``) stacked on every run of this
    #: employee after the pattern's layer; blank: none.
    harness_tag = models.CharField(max_length=120, blank=True, default="")
    #: Inline harness layer settings (camelCase JSON, as a profile's); ``{}``: none.
    harness = models.JSONField(default=dict, blank=True)
    #: The most tokens (prompt + completion) and the most cost (endpoint prices) the employee's
    #: model calls may use per UTC day, runs and chats together; null: no quota.
    daily_token_quota = models.PositiveBigIntegerField(null=True, blank=True)
    daily_cost_quota = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
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
            models.CheckConstraint(
                condition=Q(stream_retry_mode__in=StreamRetryMode.values),
                name="agents_employee_stream_retry_mode_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.username

    def clean(self) -> None:
        # The services check these first to answer with pointers; this covers the admin.
        if self.harness is None:  # an emptied admin field: no inline layer
            self.harness = {}
        if self.preset_messages is None:  # an emptied admin field: no presets
            self.preset_messages = []
        errors: dict[str, list[str]] = {}
        for problem in employee_harness_problems(self.harness_tag, self.harness):
            field, _, inner = problem["pointer"].strip("/").partition("/")
            where = f"{inner.replace('/', '.')}: " if inner else ""
            errors.setdefault(field, []).append(f"{where}{problem['detail']}")
        for path, detail in preset_message_problems(self.preset_messages):
            where = ".".join(str(part) for part in path)
            errors.setdefault("preset_messages", []).append(
                f"{where}: {detail}" if where else detail
            )
        if errors:
            raise ValidationError(errors)


class SubAgentBinding(models.Model):
    """``parent`` may hand tasks to ``child`` with ``dispatch_sub_agent_task`` (docs/sub-agents.md).

    ``endpoint`` / ``model`` override the child's model when it runs for this parent (blank:
    the child's own); ``alternatives`` are usernames of other employees tried in order when the
    child's model fails (each with its own model)."""

    parent = models.ForeignKey(Employee, on_delete=models.CASCADE, related_name="sub_agents")
    child = models.ForeignKey(Employee, on_delete=models.CASCADE, related_name="parent_bindings")
    endpoint = models.ForeignKey(
        ModelEndpoint,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="sub_agent_bindings",
    )
    model = models.CharField(max_length=200, blank=True, default="")
    alternatives = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["parent_id", "created_at", "id"]
        verbose_name = "sub-agent binding"
        constraints = [
            models.UniqueConstraint(fields=["parent", "child"], name="agents_subagent_unique"),
            models.CheckConstraint(
                condition=~Q(parent=F("child")), name="agents_subagent_not_self"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.parent_id}->{self.child_id}"

    def clean(self) -> None:
        # The services check these first to answer with pointers; this covers the admin.
        errors = sub_agent_binding_problems(self)
        if errors:
            raise ValidationError(errors)


def sub_agent_binding_problems(binding: SubAgentBinding) -> dict[str, list[str]]:
    """Field -> messages for a binding that cannot work (empty when it can)."""
    errors: dict[str, list[str]] = {}
    if binding.parent_id is not None and binding.parent_id == binding.child_id:
        errors.setdefault("child", []).append("An employee cannot be its own sub-agent.")
    alternatives = binding.alternatives
    if not isinstance(alternatives, list) or not all(isinstance(a, str) for a in alternatives):
        errors.setdefault("alternatives", []).append("A list of employee usernames.")
        return errors
    if len(set(alternatives)) != len(alternatives):
        errors.setdefault("alternatives", []).append("Each employee may be listed once.")
    if len(alternatives) > 10:
        errors.setdefault("alternatives", []).append("At most 10 alternatives.")
    known = set(
        Employee.objects.filter(username__in=alternatives).values_list("username", flat=True)
    )
    for name in alternatives:
        if name not in known:
            errors.setdefault("alternatives", []).append(f"No AI employee named {name}.")
    names = {
        pk: username
        for pk, username in Employee.objects.filter(
            pk__in=[binding.parent_id, binding.child_id]
        ).values_list("pk", "username")
    }
    for role in ("parent", "child"):
        name = names.get(getattr(binding, f"{role}_id"))
        if name is not None and name in alternatives:
            errors.setdefault("alternatives", []).append(
                f"{name} is the binding's {role}; it cannot be an alternative."
            )
    return errors


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
    "StreamRetryMode",
    "StreamToolCallCheck",
    "SubAgentBinding",
    "employee_harness_problems",
    "params_errors",
    "preset_message_problems",
    "sub_agent_binding_problems",
]


class EmployeeUsageDay(models.Model):
    """What an employee's model calls used on one UTC day (``orchestrator.agents.quotas``)."""

    username = models.CharField(max_length=150)
    day = models.DateField()
    tokens = models.PositiveBigIntegerField(default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["username", "day"], name="agents_usage_day_once")
        ]

    def __str__(self) -> str:
        return f"{self.username} {self.day}: {self.tokens} tokens, {self.cost} cost"
