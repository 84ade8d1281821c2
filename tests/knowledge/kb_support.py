"""Bases, documents and employees for the knowledge core's tests, made through the services."""

from __future__ import annotations

from typing import Any

from knowledge.models import KnowledgeBase
from knowledge.services import DocumentStored, document_put
from knowledge.services_bases import access_set, base_create
from orchestrator.agents.models import Employee, ModelEndpoint
from orchestrator.agents.services import employee_create, model_endpoint_create


def employee(username: str) -> Employee:
    """An AI employee (its endpoint is never called here)."""
    endpoint = ModelEndpoint.objects.filter(name="kb-none").first() or model_endpoint_create(
        name="kb-none", provider="openai", base_url="http://127.0.0.1:9/v1", model="none",
        max_retries=0, timeout_seconds=5,
    )  # fmt: skip
    return employee_create(username=username, endpoint=endpoint)


def local_base(key: str, **fields: Any) -> KnowledgeBase:
    return base_create(key=key, name=key.title(), **fields)


def put(base: KnowledgeBase, name: str, text: str, content_type: str = "") -> DocumentStored:
    return document_put(base=base, name=name, raw=text.encode(), content_type=content_type)


def allow(base: KnowledgeBase, *employees: str) -> None:
    for name in employees:
        if not Employee.objects.filter(username=name).exists():
            employee(name)
    access_set(base=base, employees=list(employees), by="test")
