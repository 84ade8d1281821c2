"""The UI's side of the harness layers: an employee's own layers (shown, and edited by an
operator with every problem at its field) and a trigger's overrides (refused at the field, and
the ones not applied named on the run's page)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from harness.services import profile_create
from loops.models import LoopRun
from orchestrator.agents.models import Employee
from orchestrator.agents.services import employee_create, model_endpoint_create
from tests.support.factories import make_pattern

pytestmark = pytest.mark.django_db
ClientAs = Callable[[str], Client]
TIGHT = {"limits": {"maxInvocations": 2}}


@pytest.fixture
def world() -> dict[str, Any]:
    profile_create(tag="tight", settings=TIGHT)
    endpoint = model_endpoint_create(name="offline", provider="scripted", script="demo")
    maker = employee_create(
        username="mk",
        endpoint=endpoint,
        harness_tag="tight@1",
        harness={"tools": {"deny": ["write"]}},
    )
    pattern = make_pattern(key="greet", maker_usernames=["mk"], verifier_harness_tag="tight")
    return {"maker": maker, "pattern": pattern}


def page(response: Any, status: int = 200) -> str:
    assert response.status_code == status, response.content[:2000]
    return str(response.content.decode())


def field_errors(html: str, field: str) -> str:
    """The error list rendered under ``field`` (empty when none)."""
    start = html.find(f'id="field-{field}"')
    assert start >= 0, f"no field {field}"
    block = html[start : html.find("</div>", start)]
    return block.split('class="field-errors"')[1] if 'class="field-errors"' in block else ""


def test_the_employee_page_shows_its_layers_and_links_operators_to_the_form(
    client_as: ClientAs, world: dict[str, Any]
) -> None:
    listed = page(client_as("viewer").get("/employees"))
    assert "<code>tight@1</code> + inline" in listed
    viewer = page(client_as("viewer").get("/employees/mk"))
    assert "Harness layers" in viewer and ">tight@1</a>" in viewer
    assert "&quot;deny&quot;" in viewer and "&quot;write&quot;" in viewer
    assert "/employees/mk/harness" not in viewer
    assert 'href="/employees/mk/harness"' in page(client_as("operator").get("/employees/mk"))


def test_viewers_may_not_open_or_post_the_harness_form(
    client_as: ClientAs, world: dict[str, Any]
) -> None:
    viewer = client_as("viewer")
    assert viewer.get("/employees/mk/harness").status_code == 403
    assert viewer.post("/employees/mk/harness", {"harness_tag": ""}).status_code == 403
    assert Employee.objects.get(username="mk").harness_tag == "tight@1"


def test_the_harness_form_shows_each_problem_at_its_field(
    client_as: ClientAs, world: dict[str, Any]
) -> None:
    client = client_as("operator")
    form = page(client.get("/employees/mk/harness"))
    assert 'value="tight@1"' in form and "&quot;write&quot;" in form
    body = {"harness_tag": "ghost", "harness": '{"limits": {"maxTokens": -5, "bogus": 1}}'}
    refused = page(client.post("/employees/mk/harness", body), 400)
    assert "names no published harness profile" in field_errors(refused, "harness_tag")
    inline = field_errors(refused, "harness")
    assert "limits.maxTokens: " in inline and "limits.bogus: " in inline
    bad_json = page(client.post("/employees/mk/harness", {"harness": "{oops"}), 400)
    assert "Not valid JSON" in field_errors(bad_json, "harness")
    stored = Employee.objects.get(username="mk")
    assert (stored.harness_tag, stored.harness) == ("tight@1", {"tools": {"deny": ["write"]}})


def test_the_harness_form_saves_and_clears_the_layers(
    client_as: ClientAs, world: dict[str, Any]
) -> None:
    client = client_as("operator")
    body = {"harness_tag": "tight", "harness": '{"limits": {"recursionLimit": 4}}'}
    response = client.post("/employees/mk/harness", body)
    assert response.status_code == 302 and response["Location"] == "/employees/mk"
    stored = Employee.objects.get(username="mk")
    assert (stored.harness_tag, stored.harness) == ("tight", {"limits": {"recursionLimit": 4}})
    assert (
        client.post("/employees/mk/harness", {"harness_tag": "", "harness": ""}).status_code == 302
    )
    stored.refresh_from_db()
    assert (stored.harness_tag, stored.harness) == ("", {})


def test_the_trigger_form_refuses_bad_overrides_at_their_field(
    client_as: ClientAs, world: dict[str, Any]
) -> None:
    client = client_as("operator")
    form = page(client.get("/patterns/greet/trigger"))
    assert 'name="harness_overrides"' in form
    body = {"inputs": "{}", "harness_overrides": '{"limits": {"maxInvocations": "3"}}'}
    refused = page(client.post("/patterns/greet/trigger", body), 400)
    assert "limits.maxInvocations: " in field_errors(refused, "harness_overrides")
    assert field_errors(refused, "inputs") == ""
    body["harness_overrides"] = "[1]"
    assert "Must be a JSON object" in page(client.post("/patterns/greet/trigger", body), 400)
    assert not LoopRun.objects.exists()


def test_overrides_not_applied_are_named_on_the_run_page(
    client_as: ClientAs, world: dict[str, Any]
) -> None:
    client = client_as("operator")
    overrides = '{"limits": {"maxInvocations": 10, "maxToolCalls": 5}}'
    response = client.post(
        "/patterns/greet/trigger", {"inputs": "{}", "harness_overrides": overrides}, follow=True
    )
    html = page(response)
    run = LoopRun.objects.get()
    maker = run.harness_snapshots["makers"]["mk"]
    assert maker["settings"]["limits"]["maxToolCalls"] == 5
    assert maker["layers"][-3:] == ["employee:mk:profile:tight@1", "employee:mk", "run"]
    assert "were not applied (limits.maxInvocations)" in html
    notices = html.split('id="harness-notices"')[1].split("</div>")[0]
    assert (
        'maker <span class="mono">mk</span>: <code>limits.maxInvocations</code> = <code>2</code>'
        in notices
    )
    assert "(asked <code>10</code>; set by <code>employee:mk:profile:tight@1</code>)" in notices
    assert "set by <code>profile:tight@1</code>" in notices  # the verifier's own profile
    # A run without overrides has no such notice.
    client.post("/patterns/greet/trigger", {"inputs": "{}"})
    plain = LoopRun.objects.exclude(pk=run.pk).get()
    assert 'id="harness-notices"' not in page(client.get(f"/runs/{plain.id}"))
