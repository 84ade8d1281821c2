"""Read-only queries of the employees and model endpoints pages."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count
from django.http import Http404

from orchestrator.agents.models import Employee, ModelEndpoint
from runtime.secrets import api_key_configured, current_secret_rule


def employees() -> list[Employee]:
    return list(Employee.objects.select_related("endpoint").order_by("username"))


def employee_detail(username: str) -> Employee:
    found = (
        Employee.objects.select_related("endpoint", "model_alias").filter(username=username).first()
    )
    if found is None:
        raise Http404(f"There is no employee {username!r}.")
    return found


def employee_usernames() -> list[str]:
    return list(Employee.objects.order_by("username").values_list("username", flat=True))


@dataclass(frozen=True)
class EndpointView:
    """An endpoint as the UI shows it: whether its key is set, never the key."""

    endpoint: ModelEndpoint
    key_configured: bool

    @property
    def key_refused(self) -> str | None:
        """Why the secret rule refuses its ``api_key_env`` (a row older than the rule)."""
        return current_secret_rule().check(self.endpoint.api_key_env)


def endpoints() -> list[EndpointView]:
    rows = ModelEndpoint.objects.annotate(employee_count=Count("employees")).order_by("name")
    return [EndpointView(e, api_key_configured(e.api_key_env)) for e in rows]


def endpoint_detail(name: str) -> EndpointView:
    found = (
        ModelEndpoint.objects.prefetch_related("failover_routes__target", "employees")
        .filter(name=name)
        .first()
    )
    if found is None:
        raise Http404(f"There is no model endpoint {name!r}.")
    return EndpointView(found, api_key_configured(found.api_key_env))
