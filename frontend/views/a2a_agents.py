"""External A2A agents: the registered agents, each one's card as last read (skills, streaming)
and the tool it is offered as with its trust tier; for an admin, registering an agent and
reading its card again (the connection test). Header values are never shown: only the
environment variable that holds each, and whether it is set. Writes go through
``connectors.a2a_services``, as the API's (``/api/v1/a2a-agents``, admin writes)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from connectors.a2a_serializers import A2AAgentSerializer
from connectors.a2a_services import a2a_agent_create, a2a_agent_get, a2a_agent_refresh
from connectors.models import MAX_SERVER_NAME, MAX_TIMEOUT_SECONDS, A2AAgent, AgentEffect
from frontend.access import can, ui_view
from frontend.views.connectors import header_lines, header_rows, registered
from orchestrator.accounts.roles import Role


class A2AAgentForm(forms.Form):
    """An agent to register: where its card is, how to reach it, how far to trust it."""

    name = forms.SlugField(
        max_length=MAX_SERVER_NAME,
        help_text="Lower-case words joined by hyphens; the agent is offered as a2a__<name>.",
    )
    card_url = forms.URLField(
        max_length=500,
        label="Agent card URL",
        assume_scheme="https",
        help_text="The card's URL, or the agent's base URL (its card at "
        "/.well-known/agent-card.json).",
    )
    headers = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "class": "mono"}),
        help_text="One per line: Header-Name: ENVIRONMENT_VARIABLE (e.g. Authorization: "
        "LOOPWRIGHT_SECRET_AGENT_TOKEN). The value is read from that variable at each call.",
    )
    timeout_seconds = forms.IntegerField(
        min_value=1, max_value=MAX_TIMEOUT_SECONDS, initial=60, label="Timeout (s)"
    )
    effect = forms.ChoiceField(
        choices=AgentEffect.choices,
        initial=AgentEffect.WRITE,
        label="Trust tier",
        help_text="How the harness plans a call of this agent, like a tool's effect.",
    )

    def clean_headers(self) -> dict[str, str]:
        return header_lines(self.cleaned_data["headers"])


def _list_page(request: HttpRequest, form: A2AAgentForm, status: int = 200) -> HttpResponse:
    agents = [A2AAgentSerializer(a).data for a in A2AAgent.objects.order_by("name")]
    context = {"agents": agents, "form": form, "can_register": can(request.user, Role.ADMIN)}
    return render(request, "frontend/a2a_agents/list.html", context, status=status)


@ui_view(methods=("GET", "POST"), write=Role.ADMIN)
def a2a_agent_list(request: HttpRequest) -> HttpResponse:
    """The agents; an admin's POST registers one (problems at their fields, 400)."""
    if request.method != "POST":
        return _list_page(request, A2AAgentForm())
    form = A2AAgentForm(request.POST)
    agent = registered(form, a2a_agent_create, "card_url")
    if agent is None:
        return _list_page(request, form, status=400)
    _report(request, agent)
    return redirect("ui:a2a-agent", name=agent.name)


def _report(request: HttpRequest, agent: A2AAgent) -> None:
    if agent.card_error:
        messages.error(request, f"{agent.name}: its card was not read: {agent.card_error}")
    else:
        messages.success(request, f"{agent.name}: card read ({agent.card.get('name', '?')}).")


@ui_view()
def a2a_agent_detail(request: HttpRequest, name: str) -> HttpResponse:
    agent: dict[str, Any] = A2AAgentSerializer(a2a_agent_get(name)).data
    card = agent["card"] or {}
    context = {
        "agent": agent,
        "header_rows": header_rows(agent),
        "skills": card.get("skills") or [],
        "streaming": bool((card.get("capabilities") or {}).get("streaming")),
        "can_refresh": can(request.user, Role.ADMIN),
    }
    return render(request, "frontend/a2a_agents/detail.html", context)


@ui_view(methods=("POST",), write=Role.ADMIN)
def a2a_agent_refresh_view(request: HttpRequest, name: str) -> HttpResponse:
    """Read the agent's card again (the connection test) and show the result."""
    _report(request, a2a_agent_refresh(a2a_agent_get(name)))
    return redirect("ui:a2a-agent", name=name)
