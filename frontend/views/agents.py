"""AI employees and model endpoints. API keys are never shown: only the name of the environment
variable that holds one, and whether it is set in this process. An operator edits an employee's
own harness layers (a profile tag and inline settings) and an admin who may call the employee
at its OpenAI-compatible endpoint (grants, via ``gateway.services``); the rest is read-only."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from frontend.access import actor_of, can, ui_view
from frontend.forms import EmployeeHarnessForm, add_service_errors
from frontend.selectors import agents, employee_access, policies
from gateway.services import grant_create, grant_delete
from orchestrator.accounts.roles import Role
from orchestrator.agents.models import Employee
from orchestrator.agents.services import employee_update
from orchestrator.errors import DomainError, InvalidInput


@ui_view()
def employee_list(request: HttpRequest) -> HttpResponse:
    context = {"employees": agents.employees(), "endpoints": agents.endpoints()}
    return render(request, "frontend/agents/employees.html", context)


def _harness_edit_url(request: HttpRequest, username: str) -> str | None:
    """The harness form's address for an operator; None for whoever may not edit it."""
    if not can(request.user, Role.OPERATOR):
        return None
    return reverse("ui:employee-harness", kwargs={"username": username})


class EmployeeGrantForm(forms.Form):
    """Grant a user the employee at the OpenAI-compatible endpoint, by username."""

    username = forms.CharField(
        max_length=150, label="Username", help_text="The Loopwright user who may call it."
    )


def _employee_page(
    request: HttpRequest,
    employee: Employee,
    *,
    grant_form: EmployeeGrantForm | None = None,
    status: int = 200,
) -> HttpResponse:
    context = {
        "employee": employee,
        "endpoint": agents.endpoint_detail(employee.endpoint.name),
        "harness_profile": employee.harness_tag.partition("@")[0],
        "harness_edit_url": _harness_edit_url(request, employee.username),
        "example": employee_access.endpoint_example(request, employee),
        "grants": employee_access.grants(employee),
        "records": employee_access.latest_records(employee),
        "can_grant": can(request.user, Role.ADMIN),  # grants are access control
        "grant_form": grant_form or EmployeeGrantForm(),
    }
    return render(request, "frontend/agents/employee.html", context, status=status)


@ui_view()
def employee_detail(request: HttpRequest, username: str) -> HttpResponse:
    return _employee_page(request, agents.employee_detail(username))


def _service_errors(form: forms.Form, exc: DomainError) -> None:
    errors = exc.extra.get("errors") if isinstance(exc, InvalidInput) else None
    if errors:
        add_service_errors(form, errors, fallback="username")
    else:
        form.add_error("username", exc.detail)


@ui_view(methods=("POST",), write=Role.ADMIN)
def employee_grant_add(request: HttpRequest, username: str) -> HttpResponse:
    """Grant the user named in the form this employee; problems at the field (400)."""
    employee = agents.employee_detail(username)
    form = EmployeeGrantForm(request.POST)
    if form.is_valid():
        name = form.cleaned_data["username"]
        user = employee_access.user_or_none(name)
        if user is None:
            form.add_error("username", f"There is no user {name!r}.")
        else:
            try:
                grant_create(employee=employee, user=user, actor=actor_of(request))
            except DomainError as exc:
                _service_errors(form, exc)
            else:
                messages.success(request, f"{name} may now call {employee.username}.")
                return redirect("ui:employee", username=employee.username)
    return _employee_page(request, employee, grant_form=form, status=400)


@ui_view(methods=("POST",), write=Role.ADMIN)
def employee_grant_remove(request: HttpRequest, username: str, grantee: str) -> HttpResponse:
    """Withdraw ``grantee``'s grant of this employee."""
    employee = agents.employee_detail(username)
    user = employee_access.user_or_none(grantee)
    if user is None:
        messages.error(request, f"There is no user {grantee!r}.")
        return redirect("ui:employee", username=employee.username)
    try:
        grant_delete(employee=employee, user=user, actor=actor_of(request))
    except DomainError as exc:
        messages.error(request, exc.detail)
    else:
        messages.success(request, f"{grantee} may no longer call {employee.username}.")
    return redirect("ui:employee", username=employee.username)


@ui_view(methods=("GET", "POST"), write=Role.OPERATOR, form_page=True)
def employee_harness_view(request: HttpRequest, username: str) -> HttpResponse:
    """Edit the employee's harness profile tag and inline settings; problems at their field."""
    employee = agents.employee_detail(username)
    form = EmployeeHarnessForm(
        request.POST or None, initial=EmployeeHarnessForm.initial_of(employee)
    )
    if request.method == "POST" and form.is_valid():
        try:
            employee_update(employee=employee, **form.service_fields())
        except DomainError as exc:
            errors = exc.extra.get("errors") if isinstance(exc, InvalidInput) else None
            if errors:
                add_service_errors(form, errors)
            else:
                form.add_error(None, exc.detail)
        else:
            messages.success(request, f"Harness layers of {employee.username} saved.")
            return redirect("ui:employee", username=employee.username)
    status = 400 if form.is_bound else 200
    context = {"form": form, "employee": employee, "harness_tags": policies.published_tags()}
    return render(request, "frontend/agents/harness_form.html", context, status=status)


@ui_view()
def endpoint_detail(request: HttpRequest, name: str) -> HttpResponse:
    context = {"view": agents.endpoint_detail(name)}
    return render(request, "frontend/agents/endpoint.html", context)
