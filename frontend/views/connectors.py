"""Connectors: the registered MCP servers, their tools as last listed (with the name each is
offered as and its effect tier), and, for an admin, registering a server and listing its tools
again (the connection test). Header values are never shown: only the environment variable
that holds each, and whether it is set. Writes go through ``connectors.services``, as the API's
(``/api/v1/mcp-servers``, admin writes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from connectors.models import MAX_SERVER_NAME, MAX_TIMEOUT_SECONDS, McpServer, Transport
from connectors.serializers import McpServerSerializer
from connectors.services import mcp_server_create, mcp_server_get, mcp_server_refresh
from frontend.access import can, ui_view
from frontend.forms import add_service_errors
from orchestrator.accounts.roles import Role
from orchestrator.errors import DomainError, InvalidInput

T = TypeVar("T")


def header_lines(text: str) -> dict[str, str]:
    """``Header-Name: VARIABLE`` lines → a header map; a malformed line names its number."""
    headers: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        name, sep, variable = line.partition(":")
        if not sep or not name.strip() or not variable.strip():
            raise forms.ValidationError(f"Line {number}: write Header-Name: VARIABLE.")
        headers[name.strip()] = variable.strip()
    return headers


class McpServerForm(forms.Form):
    """A server to register: where it is, how to reach it, which tools to offer."""

    name = forms.SlugField(
        max_length=MAX_SERVER_NAME,
        help_text="Lower-case words joined by hyphens; tools are offered as mcp__<name>__<tool>.",
    )
    url = forms.URLField(
        max_length=500, label="URL", assume_scheme="https", help_text="The MCP endpoint."
    )
    transport = forms.ChoiceField(choices=Transport.choices, initial=Transport.STREAMABLE_HTTP)
    headers = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "class": "mono"}),
        help_text="One per line: Header-Name: ENVIRONMENT_VARIABLE (e.g. Authorization: "
        "LOOPWRIGHT_SECRET_GITHUB_TOKEN). The value is read from that variable at each call.",
    )
    timeout_seconds = forms.IntegerField(
        min_value=1, max_value=MAX_TIMEOUT_SECONDS, initial=30, label="Timeout (s)"
    )
    tools_filter = forms.CharField(
        required=False,
        label="Tools to offer",
        help_text="The server's tool names, separated by commas; empty offers all of them.",
    )

    def clean_headers(self) -> dict[str, str]:
        return header_lines(self.cleaned_data["headers"])

    def clean_tools_filter(self) -> list[str]:
        return [n.strip() for n in self.cleaned_data["tools_filter"].split(",") if n.strip()]


def _list_page(request: HttpRequest, form: McpServerForm, status: int = 200) -> HttpResponse:
    servers = [McpServerSerializer(s).data for s in McpServer.objects.order_by("name")]
    context = {"servers": servers, "form": form, "can_register": can(request.user, Role.ADMIN)}
    return render(request, "frontend/connectors/list.html", context, status=status)


@ui_view(methods=("GET", "POST"), write=Role.ADMIN)
def connector_list(request: HttpRequest) -> HttpResponse:
    """The servers; an admin's POST registers one (problems at their fields, 400)."""
    if request.method != "POST":
        return _list_page(request, McpServerForm())
    form = McpServerForm(request.POST)
    server = registered(form, mcp_server_create, "url")
    if server is None:
        return _list_page(request, form, status=400)
    _report(request, server)
    return redirect("ui:connector", name=server.name)


def registered(form: forms.Form, create: Callable[..., T], url_field: str) -> T | None:
    """What ``create`` registers from a valid ``form``; None when the form or the service
    refused it (the service's problems are put at their fields, a URL's at ``url_field``)."""
    if not form.is_valid():
        return None
    try:
        return create(**form.cleaned_data)
    except DomainError as exc:
        errors = exc.extra.get("errors") if isinstance(exc, InvalidInput) else None
        if errors:
            add_service_errors(form, errors, url_field)
        else:
            form.add_error(None, exc.detail)
        return None


def header_rows(registration: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """``(header, environment variable, whether it is set)`` of a serialized registration."""
    configured = registration["headers_configured"]
    return [(h, v, configured.get(h, False)) for h, v in (registration["headers"] or {}).items()]


def _report(request: HttpRequest, server: McpServer) -> None:
    if server.list_error:
        messages.error(request, f"{server.name}: its tools were not listed: {server.list_error}")
    else:
        messages.success(request, f"{server.name}: {len(server.tools)} tools listed.")


@ui_view()
def connector_detail(request: HttpRequest, name: str) -> HttpResponse:
    server: dict[str, Any] = McpServerSerializer(mcp_server_get(name)).data
    rows = header_rows(server)
    context = {"server": server, "header_rows": rows, "can_refresh": can(request.user, Role.ADMIN)}
    return render(request, "frontend/connectors/detail.html", context)


@ui_view(methods=("POST",), write=Role.ADMIN)
def connector_refresh(request: HttpRequest, name: str) -> HttpResponse:
    """List the server's tools again (the connection test) and show the result."""
    _report(request, mcp_server_refresh(mcp_server_get(name)))
    return redirect("ui:connector", name=name)
