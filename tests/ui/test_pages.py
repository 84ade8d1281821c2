"""Pages rendered through the test client: what each shows, filters, errors at their fields."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client, override_settings

from frontend.diffs import json_diff
from frontend.forms import PatternForm, add_service_errors
from harness.services import profile_save_draft
from loops.models import LoopPattern, LoopStep, RunStatus
from orchestrator.agents.models import Employee, ModelEndpoint
from tests.support.factories import make_pattern, make_run

pytestmark = pytest.mark.django_db
ClientAs = Callable[[str], Client]


def html(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return str(response.content.decode())


def test_the_monitor_filters_by_status_pattern_and_trigger(client_as: ClientAs) -> None:
    greet, other = make_pattern(key="greet"), make_pattern(key="other")
    queued = make_run(greet)
    failed = make_run(greet, status=RunStatus.FAILED)
    cron = make_run(other, trigger_type="cron")
    client = client_as("viewer")
    page = html(client.get("/?status=failed"))
    assert f"run-{failed.id}" in page and f"run-{queued.id}" not in page
    page = html(client.get("/?pattern=other"))
    assert f"run-{cron.id}" in page and f"run-{queued.id}" not in page
    page = html(client.get("/?trigger=cron&status=not-a-status"))  # unknown values are ignored
    assert f"run-{cron.id}" in page and f"run-{failed.id}" not in page
    assert "status=queued" not in page.split('data-stream="')[1].split('"')[0]


def test_the_monitor_sums_tokens_and_cost_and_shows_a_dash_without_them(
    client_as: ClientAs,
) -> None:
    spent = make_run(step_count=2)
    idle = make_run()
    for seq, (tokens_in, tokens_out, cost) in enumerate([(100, 20, "0.01"), (50, 5, "0.0025")]):
        LoopStep.objects.create(
            run=spent, seq=seq + 1, role="leader", invocation="leader", kind="model",
            status="completed", tokens_in=tokens_in, tokens_out=tokens_out, cost=Decimal(cost),
        )  # fmt: skip
    page = html(client_as("viewer").get("/"))
    spent_row = page.split(f'id="run-{spent.id}"')[1].split("</tr>")[0]
    idle_row = page.split(f'id="run-{idle.id}"')[1].split("</tr>")[0]
    assert "150 / 25" in spent_row and "0.0125" in spent_row
    assert idle_row.count("—") == 5  # doing, steps, tokens, cost, attempt


def test_the_monitor_counts_runs_waiting_for_people(client_as: ClientAs) -> None:
    make_run(status=RunStatus.WAITING_APPROVAL)
    make_run(status=RunStatus.WAITING_HUMAN)
    make_run(status=RunStatus.WAITING_HUMAN)
    page = html(client_as("viewer").get("/"))
    assert 'data-count="waiting_approval">1<' in page
    assert 'data-count="waiting_human">2<' in page


def test_the_monitor_pages_to_older_runs(client_as: ClientAs) -> None:
    pattern = make_pattern()
    runs = [make_run(pattern) for _ in range(52)]
    client = client_as("viewer")
    first = html(client.get("/"))
    assert f"run-{runs[-1].id}" in first and f"run-{runs[0].id}" not in first
    older = first.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0]
    second = html(client.get("/" + older.replace("&amp;", "&")))
    assert f"run-{runs[0].id}" in second and f"run-{runs[-1].id}" not in second
    assert 'data-live-insert="false"' in second


def test_the_run_page_shows_steps_by_invocation_the_verdict_and_snapshots(
    client_as: ClientAs,
) -> None:
    run = make_run(
        status=RunStatus.SUCCEEDED,
        role_bindings={"leader": "lea", "makers": ["max"], "verifier": "vera"},
        result={
            "verdict": "pass",
            "reasons": ["tests pass"],
            "checks": [{"name": "unit tests", "passed": True, "evidence": ["artifact-7"]}],
        },
        harness_snapshots={"leader": {"profile": {"tag": "default", "version": 1}}},
    )
    LoopStep.objects.create(
        run=run, seq=1, role="leader", invocation="leader", kind="model", status="completed",
        name="gpt-x", tokens_in=12, tokens_out=3, duration_ms=1500,
        response={"message": {"role": "assistant", "content": "Plan: edit the file",
                              "tool_calls": [{"function": {"name": "read"}}]}},
    )  # fmt: skip
    LoopStep.objects.create(
        run=run, seq=2, role="maker", invocation="maker:0", kind="tool", status="failed",
        name="write", request={"arguments": {"path": "a.txt"}}, error="disk full",
    )  # fmt: skip
    page = html(client_as("viewer").get(f"/runs/{run.id}"))
    assert page.index("Leader") < page.index("Maker 1")
    assert "Plan: edit the file" in page and "Asked for: read" in page
    assert "12 in / 3 out tokens" in page and "1.5 s" in page
    assert "disk full" in page and "&quot;path&quot;: &quot;a.txt&quot;" in page
    assert "unit tests" in page and "artifact-7" in page and "tests pass" in page
    assert "profile default@1" in page
    assert 'data-terminal="true"' in page


def test_an_edit_maps_nested_service_errors_onto_the_fields(client_as: ClientAs) -> None:
    make_pattern(key="greet")
    form = {
        "goal_template": "Go",
        "autonomy_level": "L2",
        "trigger_type": "cron",
        "cron_expression": "not cron",
        "timezone": "Mars/Olympus",
        "missed_fire_policy": "coalesce",
        "leader_username": "a",
        "verifier_username": "b",
        "leader_harness_tag": "default",
        "maker_harness_tag": "nope",
        "verifier_harness_tag": "safe",
        "policy": '{"approvals": {"timeoutSeconds": 0}}',
    }
    response = client_as("operator").post("/patterns/greet/edit", form)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert "approvals.timeoutSeconds" in errors["policy"][0]
    form["policy"] = "{}"
    errors = client_as("operator").post("/patterns/greet/edit", form).context["form"].errors
    assert set(errors) >= {
        "repository_key", "acting_on", "policy", "cron_expression", "timezone", "maker_harness_tag",
    }  # fmt: skip
    assert "harness.isolation.requireWorktree" in errors["policy"][0]
    assert LoopPattern.objects.get(key="greet").version == 1


def test_service_errors_without_a_matching_field_go_on_top() -> None:
    form = PatternForm(data={})
    form.is_valid()
    add_service_errors(form, [{"pointer": "/somewhere/else", "detail": "odd"}])
    assert form.non_field_errors() == ["somewhere.else: odd"]


def test_the_draft_form_shows_every_settings_problem(client_as: ClientAs) -> None:
    response = client_as("admin").post(
        "/policies/default/draft",
        {"settings": '{"tools": {"allow": 3}, "limits": {"maxCost": -1}}', "note": ""},
    )
    assert response.status_code == 400
    problems = response.context["form"].errors["settings"]
    assert len(problems) == 2
    assert any(p.startswith("tools.allow") for p in problems)
    assert any(p.startswith("limits.maxCost") for p in problems)


def test_publishing_without_a_draft_says_why(client_as: ClientAs) -> None:
    response = client_as("admin").post("/policies/default/publish", follow=True)
    assert "has no open draft to publish" in html(response)


def test_the_diff_page_shows_what_changed(client_as: ClientAs) -> None:
    profile_save_draft(tag="default", settings={"paths": {"maxFiles": 10}})
    page = html(client_as("viewer").get("/policies/default/diff?from=1&to=2"))
    assert 'class="diff-add">+    &quot;maxFiles&quot;: 10' in page
    same = html(client_as("viewer").get("/policies/default/diff?from=1&to=1"))
    assert "have the same settings" in same
    missing = client_as("viewer").get("/policies/default/diff?from=1&to=9")
    assert missing.status_code == 404


def test_json_diff_is_empty_for_equal_documents_and_marks_lines() -> None:
    assert json_diff({"a": 1}, {"a": 1}, "x", "y") == []
    kinds = [line.kind for line in json_diff({"a": 1}, {"a": 2}, "x", "y")]
    assert kinds[:3] == ["file", "file", "hunk"] and "add" in kinds and "del" in kinds


def test_the_compile_preview_plans_tools_and_points_at_bad_layers(client_as: ClientAs) -> None:
    client = client_as("viewer")
    page = html(client.get("/policies/compile"))
    assert "&quot;name&quot;: &quot;write&quot;" in page  # the builtin tools prefilled
    good = html(
        client.get(
            "/policies/compile",
            {"tag": "safe", "tools": '[{"name": "write", "effect": "write"}]'},
        )
    )
    assert "denied by tools.deny" in good and "profile safe@1" in good
    bad = client.get(
        "/policies/compile",
        {"tag": "safe", "employee_layer": '{"limits": {"maxCost": "x"}}', "tools": "[]"},
    )
    assert "limits.maxCost" in bad.context["form"].errors["employee_layer"][0]
    unknown = client.get("/policies/compile", {"tag": "nope", "tools": "[]"})
    assert "nope" in unknown.context["form"].errors["tag"][0]


def test_employees_and_endpoints_never_show_a_key(
    client_as: ClientAs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOPWRIGHT_SECRET_UI_TEST_KEY", "sk-secret-never-shown")
    endpoint = ModelEndpoint.objects.create(
        name="main",
        base_url="http://127.0.0.1:9/v1",
        model="m",
        api_key_env="LOOPWRIGHT_SECRET_UI_TEST_KEY",
    )
    ModelEndpoint.objects.create(
        name="spare",
        base_url="http://127.0.0.1:9/v1",
        model="m",
        api_key_env="LOOPWRIGHT_SECRET_UNSET_KEY",
    )
    ModelEndpoint.objects.create(  # a row older than the secret rule
        name="old", base_url="http://127.0.0.1:9/v1", model="m", api_key_env="SECRET_KEY"
    )
    Employee.objects.create(username="ada", endpoint=endpoint, tools=["read"])
    client = client_as("viewer")
    pages = [html(client.get(path)) for path in ("/employees", "/employees/ada", "/endpoints/main")]
    for page in pages:
        assert "sk-secret-never-shown" not in page
        assert "LOOPWRIGHT_SECRET_UI_TEST_KEY" in page
    assert "configured" in pages[0] and "not set" in pages[0] and "not allowed" in pages[0]
    assert client.get("/endpoints/none").status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "/runs/0190c0de-0000-7000-8000-000000000000",  # fixed: xdist workers must agree
        "/runs/12",
        "/patterns/none",
        "/policies/none",
        "/policies/default/versions/9",
        "/employees/none",
    ],
)
def test_unknown_things_are_html_404_pages(path: str, client_as: ClientAs) -> None:
    response = client_as("viewer").get(path)
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
    assert b"Not found" in response.content and b"Traceback" not in response.content


def test_an_unexpected_error_in_a_view_is_an_html_500_page(
    client_as: ClientAs, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("kaput")

    monkeypatch.setattr("frontend.selectors.patterns.patterns_with_last_run", boom)
    client = client_as("viewer")
    client.raise_request_exception = False  # as a browser sees it
    response = client.get("/patterns", HTTP_X_REQUEST_ID="req-42")
    assert response.status_code == 500
    body = response.content.decode()
    assert "Something went wrong" in body and "req-42" in body and "kaput" not in body


@override_settings(ROOT_URLCONF="tests.ui.negotiating_urls")
def test_the_content_negotiating_handlers_answer_browsers_in_html_and_the_api_in_json(
    client: Client,
) -> None:
    page = client.get("/no/such/page", HTTP_ACCEPT="text/html,application/xhtml+xml")
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")
    assert b"There is no page at this address" in page.content
    api = client.get("/api/v1/no-such", HTTP_ACCEPT="text/html")
    assert api.status_code == 404 and api["Content-Type"] == "application/problem+json"
    script = client.get("/no/such/page", HTTP_ACCEPT="*/*")
    assert script["Content-Type"] == "application/problem+json"
