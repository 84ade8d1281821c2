"""The Django admin pages for endpoints and employees."""

from __future__ import annotations

import pytest
from django.test import Client

from orchestrator.agents import services
from orchestrator.agents.models import ModelEndpoint

pytestmark = pytest.mark.django_db


def test_the_admin_lists_and_edits_both_models(admin_client: Client):
    endpoint = services.model_endpoint_create(name="offline", provider="scripted")
    services.employee_create(username="lead", endpoint=endpoint)

    for url in (
        "/admin/agents/modelendpoint/",
        "/admin/agents/modelendpoint/add/",
        f"/admin/agents/modelendpoint/{endpoint.pk}/change/",
        "/admin/agents/employee/",
        "/admin/agents/employee/add/",
    ):
        assert admin_client.get(url).status_code == 200, url


def test_the_admin_refuses_bad_parameters(admin_client: Client):
    form = {
        "name": "primary",
        "provider": "openai",
        "base_url": "https://example.test/v1",
        "model": "m",
        "params": '{"temperature": 9}',
        "context_window": 1000,
        "input_price_per_token": "0",
        "output_price_per_token": "0",
        "max_retries": 3,
        "timeout_seconds": 60,
        "circuit_cooldown_seconds": 60,
        "failover_routes-TOTAL_FORMS": 0,
        "failover_routes-INITIAL_FORMS": 0,
    }

    response = admin_client.post("/admin/agents/modelendpoint/add/", form)

    assert response.status_code == 200  # the form again, with the error
    assert "temperature" in response.content.decode()
    assert not ModelEndpoint.objects.exists()
