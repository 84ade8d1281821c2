"""The API tokens page (admins only): every token with its user, roles, dates and quotas; a
form that creates one, whose answer is the only page that ever shows the full token; and
revoking a token after a confirmation page. Writes go through
``orchestrator.accounts.token_admin``, as the API's ``/api/v1/api-tokens``."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from frontend.access import ui_view
from frontend.selectors import api_tokens as selectors
from frontend.views.connectors import registered
from orchestrator.accounts.models import ApiToken
from orchestrator.accounts.roles import Role
from orchestrator.accounts.token_admin import (
    NAME_MAX,
    USERNAME_MAX,
    api_token_issue,
    api_token_revoke,
)

ROLE_CHOICES = [(r.value, r.value) for r in Role]


class ApiTokenForm(forms.Form):
    """A token to create: the user (created when new) is granted the ticked roles."""

    username = forms.CharField(
        max_length=USERNAME_MAX, help_text="The user the token acts as; created when new."
    )
    roles = forms.MultipleChoiceField(
        choices=ROLE_CHOICES,
        widget=forms.CheckboxSelectMultiple,
        help_text="Granted to the user (added to the roles it holds).",
    )
    name = forms.CharField(max_length=NAME_MAX, initial="ui", help_text="A label for the token.")
    expires_at = forms.DateTimeField(
        required=False,
        label="Expires (UTC)",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="Empty: never. Must be in the future.",
    )
    daily_token_quota = forms.IntegerField(
        required=False,
        min_value=0,
        label="Daily token quota",
        help_text="The most tokens its chat completions may use per UTC day; empty: none.",
    )
    daily_cost_quota = forms.DecimalField(
        required=False,
        min_value=0,
        max_digits=12,
        decimal_places=4,
        label="Daily cost quota",
        help_text="The most cost its chat completions may use per UTC day; empty: none.",
    )


def _page(request: HttpRequest, form: ApiTokenForm, status: int = 200) -> HttpResponse:
    context = {"tokens": selectors.tokens(), "form": form}
    return render(request, "frontend/api_tokens/list.html", context, status=status)


@ui_view(methods=("GET", "POST"), write=Role.ADMIN, form_page=True)
def api_token_list(request: HttpRequest) -> HttpResponse:
    """The tokens and the create form; a valid POST answers with the new token, shown once."""
    if request.method != "POST":
        return _page(request, ApiTokenForm())
    form = ApiTokenForm(request.POST)
    issued = registered(form, api_token_issue, "username")
    if issued is None:
        return _page(request, form, status=400)
    row, token = issued
    response = render(
        request, "frontend/api_tokens/created.html", {"row": row, "token": token}, status=201
    )
    response["Cache-Control"] = "no-store"
    return response


@ui_view(methods=("GET", "POST"), write=Role.ADMIN, form_page=True)
def api_token_revoke_view(request: HttpRequest, prefix: str) -> HttpResponse:
    """GET: the confirmation page; POST: revoke (idempotent) and back to the list."""
    token = get_object_or_404(ApiToken.objects.select_related("user"), prefix=prefix)
    if request.method != "POST":
        return render(request, "frontend/api_tokens/revoke.html", {"token": token})
    api_token_revoke(token=token)
    messages.success(
        request, f"Token {token.prefix} of {token.user.get_username()} revoked; it is refused now."
    )
    return redirect("ui:api-tokens")
