"""MCP servers whose tools agents may call (``mcp__<server>__<tool>``, docs/interop.md).

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
            problems.append(f"{header} is set by the MCP transport itself")
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
