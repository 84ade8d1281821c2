"""The Gateway page: what stands between every model call and its provider (docs/gateway.md).

Model aliases are listed with their rules and the employees they route, and an operator creates,
replaces or deletes one here (through ``orchestrator.agents.aliases``, as the API's
``/api/v1/model-aliases``). The patterns' gateway policies (daily budgets used today, semantic
cache, content safety), the daily quotas of employees and API tokens with today's usage, and
each employee's chat guardrails are shown with links to where each is set.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from frontend.access import can, ui_view
from frontend.selectors import gateway as selectors
from frontend.views.connectors import registered
from orchestrator.accounts.roles import Role
from orchestrator.agents.aliases import alias_create, alias_delete, alias_update
from orchestrator.agents.models import ModelAlias
from orchestrator.errors import DomainError

RULES_EXAMPLE = '[{"roles": ["maker"], "max_price_per_million_tokens": 5, "targets": ["a", "b"]}]'


class AliasForm(forms.Form):
    """An alias to create, or to replace when the name exists."""

    name = forms.SlugField(max_length=100, help_text="Employees choose it as their model alias.")
    description = forms.CharField(required=False, max_length=2000)
    rules = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6, "class": "mono"}),
        help_text="A JSON list; the first rule matching a call's pattern and role with a target "
        f"within its ceiling routes it. Example: {RULES_EXAMPLE}",
    )

    def clean_rules(self) -> Any:
        try:
            return json.loads(self.cleaned_data["rules"])
        except ValueError as exc:
            raise forms.ValidationError(f"Not JSON: {exc}") from None


def _save(actor: str, name: str, **fields: Any) -> ModelAlias:
    alias = ModelAlias.objects.filter(name=name).first()
    if alias is None:
        return alias_create(name=name, actor=actor, **fields)
    return alias_update(alias=alias, actor=actor, **fields)


def _page(request: HttpRequest, form: AliasForm, status: int = 200) -> HttpResponse:
    context = {
        "aliases": selectors.aliases(),
        "patterns": selectors.pattern_policies(),
        "employee_quotas": selectors.employee_quotas(),
        "token_quotas": selectors.token_quotas(),
        "guardrails": selectors.chat_guardrails(),
        "form": form,
        "can_write": can(request.user, Role.OPERATOR),
    }
    return render(request, "frontend/gateway/settings.html", context, status=status)


@ui_view(methods=("GET", "POST"), write=Role.OPERATOR)
def gateway_settings(request: HttpRequest) -> HttpResponse:
    """The settings; an operator's POST creates or replaces an alias (problems at the fields)."""
    if request.method != "POST":
        return _page(request, AliasForm())
    form = AliasForm(request.POST)
    actor = request.user.get_username()
    alias = registered(form, lambda **fields: _save(actor, **fields), "rules")
    if alias is None:
        return _page(request, form, status=400)
    messages.success(request, f"Model alias {alias.name} saved.")
    return redirect("ui:gateway")


@ui_view(methods=("POST",), write=Role.OPERATOR)
def gateway_alias_delete(request: HttpRequest, name: str) -> HttpResponse:
    try:
        alias_delete(alias=get_object_or_404(ModelAlias, name=name))
    except DomainError as exc:
        messages.error(request, exc.detail)
    else:
        messages.success(request, f"Model alias {name} deleted.")
    return redirect("ui:gateway")
