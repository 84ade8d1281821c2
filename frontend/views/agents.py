"""AI employees and model endpoints, read-only. API keys are never shown: only the name of the
environment variable that holds one, and whether it is set in this process."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from frontend.access import ui_view
from frontend.selectors import agents


@ui_view()
def employee_list(request: HttpRequest) -> HttpResponse:
    context = {"employees": agents.employees(), "endpoints": agents.endpoints()}
    return render(request, "frontend/agents/employees.html", context)


@ui_view()
def employee_detail(request: HttpRequest, username: str) -> HttpResponse:
    employee = agents.employee_detail(username)
    context = {
        "employee": employee,
        "endpoint": agents.endpoint_detail(employee.endpoint.name),
    }
    return render(request, "frontend/agents/employee.html", context)


@ui_view()
def endpoint_detail(request: HttpRequest, name: str) -> HttpResponse:
    context = {"view": agents.endpoint_detail(name)}
    return render(request, "frontend/agents/endpoint.html", context)
