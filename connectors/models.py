"""MCP servers whose tools agents may call (``mcp__<server>__<tool>``), and external A2A agents
offered as tools (``a2a__<agent>``), docs/interop.md.

A server row holds where it is and how to reach it, never a secret: each header's value is read
from an environment variable the secret rule allows, at every call. ``tools`` is the server's
tool list as last read (``tools/list``), with what each tool is offered as.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from orchestrator.guard import outbound_url_problem, secret_rule

#: Lower-case words joined by single hyphens: no ``__``, so ``mcp__<server>__<tool>`` parses.
SERVER_NAME = r"^[a-z0-9]+(-[a-z0-9]+)*$"
MAX_SERVER_NAME = 24
MAX_TIMEOUT_SECONDS = 600
#: An HTTP header name (RFC 9110 token characters).
_HEADER_NAME = RegexValidator(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}$")
#: Headers a server entry may not set: the transport owns them.
RESERVED_HEADERS = frozenset(
    {"host", "content-length", "content-type", "accept", "connection", "transfer-encoding",
     "mcp-session-id", "mcp-protocol-version"}
)  # fmt: skip


class Transport(models.TextChoices):
    STREAMABLE_HTTP = "streamable_http", "Streamable HTTP"
    SSE = "sse", "HTTP + SSE (older servers)"


def _validate_headers(value: Any) -> None:
    if not isinstance(value, dict):
        raise ValidationError("headers must be an object: header name → environment variable.")
    problems = []
    for header, variable in value.items():
        try:
            _HEADER_NAME(header)
        except ValidationError:
            problems.append(f"{header!r} is not an HTTP header name")
            continue
        if header.lower() in RESERVED_HEADERS:
            problems.append(f"{header} is set by the transport itself")
        if not isinstance(variable, str) or not variable:
            problems.append(f"{header}: name the environment variable that holds its value")
            continue
        refusal = secret_rule().check(variable, field=f"headers.{header}")
        if refusal is not None:
            problems.append(refusal)
    if problems:
        raise ValidationError(problems)


def _validate_tools_filter(value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
        raise ValidationError("tools_filter must be a list of the server's tool names.")


class McpServer(models.Model):
    """An MCP server reached over streamable HTTP (or SSE); its tools, as last listed."""

    name = models.CharField(
        max_length=MAX_SERVER_NAME,
        unique=True,
        validators=[RegexValidator(SERVER_NAME, "Use lower-case words joined by hyphens.")],
        help_text="Tools are offered as mcp__<name>__<tool>.",
    )
    url = models.URLField(max_length=500)
    transport = models.CharField(
        max_length=20, choices=Transport.choices, default=Transport.STREAMABLE_HTTP
    )
    #: Header name → the environment variable holding its value (never the value).
    headers = models.JSONField(default=dict, blank=True, validators=[_validate_headers])
    timeout_seconds = models.PositiveIntegerField(
        default=30, validators=[MinValueValidator(1), MaxValueValidator(MAX_TIMEOUT_SECONDS)]
    )
    #: The server's tool names to offer; empty: all of them.
    tools_filter = models.JSONField(default=list, blank=True, validators=[_validate_tools_filter])
    enabled = models.BooleanField(default=True)
    #: ``[{name, description, input_schema, annotations, offered_as, skipped}]`` as last listed.
    tools = models.JSONField(default=list, blank=True, editable=False)
    tools_listed_at = models.DateTimeField(null=True, blank=True, editable=False)
    #: Why the last listing failed ("" after a good one).
    list_error = models.TextField(blank=True, default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        # The outbound guard at save time (every connection checks it again).
        problem = outbound_url_problem(self.url) if self.url else ""
        if problem:
            raise ValidationError({"url": problem})


class AgentEffect(models.TextChoices):
    """The trust tier of an agent's tool, as the harness plans with it."""

    READ = "read", "read (runs without a gate)"
    WRITE = "write", "write (a human gate unless trusted)"
    EXTERNAL = "external", "external (high-risk)"


class A2AAgent(models.Model):
    """An external A2A agent, reached by its agent card; offered as the tool ``a2a__<name>``."""

    name = models.CharField(
        max_length=MAX_SERVER_NAME,
        unique=True,
        validators=[RegexValidator(SERVER_NAME, "Use lower-case words joined by hyphens.")],
        help_text="The agent is offered as the tool a2a__<name>.",
    )
    #: The agent card's URL, or the agent's base URL (its card at the well-known path).
    card_url = models.URLField(max_length=500)
    #: Header name → the environment variable holding its value (never the value).
    headers = models.JSONField(default=dict, blank=True, validators=[_validate_headers])
    timeout_seconds = models.PositiveIntegerField(
        default=60, validators=[MinValueValidator(1), MaxValueValidator(MAX_TIMEOUT_SECONDS)]
    )
    effect = models.CharField(max_length=10, choices=AgentEffect.choices, default=AgentEffect.WRITE)
    enabled = models.BooleanField(default=True)
    #: The card as last read (JSON, as the agent serves it).
    card = models.JSONField(default=dict, blank=True, editable=False)
    card_read_at = models.DateTimeField(null=True, blank=True, editable=False)
    #: Why the last reading of the card failed ("" after a good one).
    card_error = models.TextField(blank=True, default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "A2A agent"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        problem = outbound_url_problem(self.card_url) if self.card_url else ""
        if problem:
            raise ValidationError({"card_url": problem})


class A2ACall(models.Model):
    """One ``a2a__<agent>`` tool call: the remote task it started, so a re-issued call follows
    that task instead of sending its message again."""

    #: The call's ``ToolContext.call_key`` (``<run>:<step>:<call>``), the same across its
    #: approvals and answers.
    idempotency_key = models.CharField(max_length=200, unique=True)
    agent = models.ForeignKey(A2AAgent, on_delete=models.CASCADE, related_name="calls")
    #: Set just before the message is sent: a re-issue that finds it without a task id does
    #: not know whether the agent got the message, and does not send it again.
    sent_at = models.DateTimeField(null=True, blank=True)
    task_id = models.CharField(max_length=200, blank=True, default="")
    context_id = models.CharField(max_length=200, blank=True, default="")
    #: ``new`` before sending, then the remote task's state (``working``, ``completed``, ...).
    state = models.CharField(max_length=20, default="new")
    #: The idempotency key of the approval whose answer was last sent to the task (written
    #: just before it is sent): a re-issue after a crash never sends that answer again.
    answered_key = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "A2A call"

    def __str__(self) -> str:
        return f"{self.agent_id}:{self.idempotency_key}"
