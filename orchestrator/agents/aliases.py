"""Writes for model aliases (docs/model-routing.md): each validates the whole row (its rules'
schema, and that every target names an endpoint) and answers with pointers into ``rules``."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import ProtectedError

from orchestrator.agents.models import ModelAlias, alias_problems
from orchestrator.agents.routing import parse_rules, rule_targets
from orchestrator.errors import Conflict, InvalidInput, full_clean_or_invalid

ALIAS_FIELDS = ("description", "rules")


def _check(alias: ModelAlias) -> None:
    problems = alias_problems(alias.rules)
    if problems:
        errors = [
            {
                "pointer": "/rules" + "".join(f"/{part}" for part in path),
                "detail": detail,
                "code": "invalid",
            }
            for path, detail in problems
        ]
        raise InvalidInput(f"The alias rules are invalid: {errors[0]['detail']}", errors=errors)
    alias.rules = [rule.model_dump(mode="json") for rule in parse_rules(alias.rules)]
    full_clean_or_invalid(alias)


@transaction.atomic
def alias_create(*, name: str, actor: str, **fields: Any) -> ModelAlias:
    alias = ModelAlias(
        name=name, updated_by=actor, **{k: v for k, v in fields.items() if k in ALIAS_FIELDS}
    )
    if ModelAlias.objects.filter(name=name).exists():
        raise Conflict(f"A model alias named {name} already exists.")
    _check(alias)
    alias.save()
    return alias


@transaction.atomic
def alias_update(*, alias: ModelAlias, actor: str, **fields: Any) -> ModelAlias:
    """Change the description and/or the rules (the name cannot change)."""
    if "name" in fields and fields["name"] != alias.name:
        error = {"pointer": "/name", "detail": "The name cannot change.", "code": "invalid"}
        raise InvalidInput("The name cannot change.", errors=[error])
    changed = [field for field in fields if field in ALIAS_FIELDS]
    for field in changed:
        setattr(alias, field, fields[field])
    alias.updated_by = actor
    _check(alias)
    alias.save(update_fields=[*changed, "updated_by", "updated_at"])
    return alias


def alias_delete(*, alias: ModelAlias) -> None:
    """Delete an alias no employee routes by."""
    try:
        with transaction.atomic():
            alias.delete()
    except ProtectedError as exc:
        users = sorted({str(obj) for obj in exc.protected_objects})
        raise Conflict(f"Model alias {alias.name} is still used by: {', '.join(users)}.") from None


def aliases_routing_to(endpoint_name: str) -> list[str]:
    """The aliases with a rule naming ``endpoint_name`` as a target."""
    return [
        alias.name
        for alias in ModelAlias.objects.order_by("name")
        if endpoint_name in rule_targets(parse_rules(alias.rules))
    ]
