"""Writes for model endpoints and AI employees.

Every write validates the whole row (field validators, parameter schema, check constraints)
before saving and turns refusals into :class:`InvalidInput` / :class:`Conflict`, so the API, the
admin and management commands refuse the same things in the same words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import ProtectedError

from harness.schema import layer_validate
from orchestrator.agents.aliases import aliases_routing_to
from orchestrator.agents.models import (
    Employee,
    FailoverRoute,
    ModelEndpoint,
    SubAgentBinding,
    employee_harness_problems,
)
from orchestrator.errors import (
    Conflict,
    NotFound,
    full_clean_or_invalid,
    invalid_fields,
)
from runtime.model_config import ModelParams


@dataclass(frozen=True)
class FailoverSpec:
    """One failover hop as the caller gives it: the endpoint, and optional overrides."""

    target: ModelEndpoint
    model: str = ""
    params: ModelParams | None = None


_invalid = invalid_fields
_full_clean = full_clean_or_invalid


def _check_failover(routes: list[FailoverRoute]) -> None:
    errors: list[dict[str, str]] = []
    seen: set[int] = set()
    for index, route in enumerate(routes):
        pointer = f"/failover/{index}/endpoint"
        if route.target_id in seen:
            errors.append({"pointer": pointer, "detail": f"{route.target} is listed twice."})
        seen.add(route.target_id)
        try:
            route.clean()
        except ValidationError as exc:
            errors.extend({"pointer": pointer, "detail": msg} for msg in exc.messages)
    if errors:
        raise _invalid([{**error, "code": "invalid"} for error in errors])


def _replace_failover(endpoint: ModelEndpoint, failover: Sequence[FailoverSpec]) -> None:
    routes = [
        FailoverRoute(
            source=endpoint,
            target=hop.target,
            priority=priority,
            model=hop.model,
            params=hop.params.to_api() if hop.params else {},
        )
        for priority, hop in enumerate(failover)
    ]
    _check_failover(routes)
    endpoint.failover_routes.all().delete()
    FailoverRoute.objects.bulk_create(routes)


def _params_dict(params: ModelParams | dict[str, Any] | None) -> dict[str, Any]:
    if isinstance(params, ModelParams):
        return params.to_api()
    return dict(params or {})


@transaction.atomic
def model_endpoint_create(
    *,
    name: str,
    failover: Sequence[FailoverSpec] = (),
    params: ModelParams | dict[str, Any] | None = None,
    **fields: Any,
) -> ModelEndpoint:
    """Create an endpoint and its failover routes (in priority order)."""
    endpoint = ModelEndpoint(name=name, params=_params_dict(params), **fields)
    _full_clean(endpoint)
    endpoint.save()
    _replace_failover(endpoint, failover)
    return endpoint


@transaction.atomic
def model_endpoint_update(
    *,
    endpoint: ModelEndpoint,
    failover: Sequence[FailoverSpec] | None = None,
    params: ModelParams | dict[str, Any] | None = None,
    **fields: Any,
) -> ModelEndpoint:
    """Change the given fields; ``failover``, when given, replaces the whole route list."""
    if "name" in fields and fields["name"] != endpoint.name:
        raise _invalid(
            [{"pointer": "/name", "detail": "The name cannot change.", "code": "invalid"}]
        )
    changed = [field for field in fields if field != "name"]
    for field in changed:
        setattr(endpoint, field, fields[field])
    if params is not None:
        endpoint.params = _params_dict(params)
        changed.append("params")
    _full_clean(endpoint)
    endpoint.save(update_fields=[*changed, "updated_at"])
    if failover is not None:
        _replace_failover(endpoint, failover)
    return endpoint


def model_endpoint_delete(*, endpoint: ModelEndpoint) -> None:
    """Delete an endpoint no employee uses, no other endpoint fails over to and no model
    alias routes to."""
    try:
        with transaction.atomic():
            aliases = aliases_routing_to(endpoint.name)
            if aliases:
                raise Conflict(
                    f"Model endpoint {endpoint.name} is a target of model alias(es): "
                    f"{', '.join(aliases)}."
                )
            endpoint.delete()
    except ProtectedError as exc:
        users = sorted({str(obj) for obj in exc.protected_objects})
        raise Conflict(
            f"Model endpoint {endpoint.name} is still in use by: {', '.join(users)}."
        ) from None


def _check_harness(employee: Employee) -> None:
    """The employee's harness fields, with pointers into them (``/harness/limits/maxTokens``);
    the inline layer is stored as validated (camelCase, only the keys it states)."""
    employee.harness_tag = (employee.harness_tag or "").strip()
    problems = employee_harness_problems(employee.harness_tag, employee.harness)
    if problems:
        raise _invalid(problems)
    employee.harness = layer_validate(employee.harness).model_dump(exclude_unset=True)


@transaction.atomic
def employee_create(
    *, username: str, endpoint: ModelEndpoint, params: ModelParams | None = None, **fields: Any
) -> Employee:
    """Create an employee; ``harness_tag`` and ``harness`` are its own harness layers."""
    employee = Employee(username=username, endpoint=endpoint, params=_params_dict(params), **fields)
    _check_harness(employee)
    _full_clean(employee)
    employee.save()
    return employee


@transaction.atomic
def employee_update(
    *, employee: Employee, params: ModelParams | None = None, **fields: Any
) -> Employee:
    """Change the given fields of an employee (the username cannot change)."""
    if "username" in fields and fields["username"] != employee.username:
        error = {"pointer": "/username", "detail": "The username cannot change.", "code": "invalid"}
        raise _invalid([error])
    changed = [field for field in fields if field != "username"]
    for field in changed:
        setattr(employee, field, fields[field])
    if params is not None:
        employee.params = _params_dict(params)
        changed.append("params")
    _check_harness(employee)
    _full_clean(employee)
    employee.save(update_fields=[*changed, "updated_at"])
    return employee


def employee_delete(*, employee: Employee) -> None:
    employee.delete()


# --- Sub-agent bindings (docs/sub-agents.md) ----------------------------------------------------


def sub_agent_bindings(*, parent: Employee) -> list[SubAgentBinding]:
    """The employees ``parent`` may dispatch sub-agent tasks to, oldest binding first."""
    return list(
        SubAgentBinding.objects.filter(parent=parent)
        .select_related("child", "endpoint")
        .order_by("created_at", "id")
    )


@transaction.atomic
def sub_agent_binding_create(
    *,
    parent: Employee,
    child: Employee,
    endpoint: ModelEndpoint | None = None,
    model: str = "",
    alternatives: Sequence[str] = (),
) -> SubAgentBinding:
    """Bind ``child`` to ``parent`` as a sub-agent (409 when it already is), with an optional
    model override (``endpoint`` and/or ``model``) and ``alternatives`` to try in order."""
    if SubAgentBinding.objects.filter(parent=parent, child=child).exists():
        raise Conflict(f"{child.username} is already a sub-agent of {parent.username}.")
    binding = SubAgentBinding(
        parent=parent,
        child=child,
        endpoint=endpoint,
        model=model.strip(),
        alternatives=list(alternatives),
    )
    _full_clean(binding)
    binding.save()
    return binding


@transaction.atomic
def sub_agent_binding_delete(*, parent: Employee, child_username: str) -> None:
    """Remove the binding of ``child_username`` to ``parent`` (404 when there is none)."""
    deleted, _ = SubAgentBinding.objects.filter(
        parent=parent, child__username=child_username
    ).delete()
    if not deleted:
        raise NotFound(f"{child_username} is not a sub-agent of {parent.username}.")
