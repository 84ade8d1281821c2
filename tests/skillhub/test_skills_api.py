"""The Skill Hub REST API without workers: CRUD and its validation, roles, input checks, the rate
limit, scope refusals, templates, the MCP-style listing and output file downloads."""

from __future__ import annotations

import base64
import io
import zipfile
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from orchestrator.agents.services import employee_create, model_endpoint_create
from skillhub.catalog import TEMPLATES
from skillhub.models import Skill, SkillExecution, SkillOutputFile
from skillhub.services.access import Caller, SkillForbidden
from skillhub.services.calls import EXECUTION_SUMMARY_SCHEMA
from skillhub.services.executions import execution_request
from skillhub.services.skills import skill_create
from tests.skillhub.conftest import NUMBERS, PY_ADD

pytestmark = pytest.mark.django_db
PROBLEM = "application/problem+json"


def body(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "tool_name": "py_add",
        "title": "Add",
        "description": "Adds two integers",
        "code_template": PY_ADD,
        "language": "python",
        "input_schema": NUMBERS,
    }
    data.update(overrides)
    return data


def pointers(response: Any) -> list[str]:
    return [e["pointer"] for e in response.json().get("errors", [])]


def test_an_operator_creates_a_skill_and_reads_it_back(operator_client: APIClient) -> None:
    response = operator_client.post("/api/v1/skills", body(), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["agent_tool_name"] == "skill_hub_py_add"
    got = operator_client.get("/api/v1/skills/py_add").json()
    assert got["input_schema"] == NUMBERS
    assert got["tool_scope"] == "general" and got["enabled"] is True


def test_a_viewer_reads_skills_but_cannot_create_one(
    viewer_client: APIClient, make_skill: Callable[..., Skill]
) -> None:
    make_skill()
    assert viewer_client.get("/api/v1/skills").status_code == 200
    response = viewer_client.post("/api/v1/skills", body(tool_name="other"), format="json")
    assert response.status_code == 403
    assert response["Content-Type"] == PROBLEM


@pytest.mark.parametrize(
    ("overrides", "pointer"),
    [
        (
            {"input_schema": {"type": "object", "properties": {"a": {"type": "nope"}}}},
            "/input_schema",
        ),
        ({"input_schema": {"type": "string"}}, "/input_schema"),
        ({"code_template": "print({{undeclared}})"}, "/code_template"),
        ({"tool_name": "Bad-Name"}, "/tool_name"),
        ({"timeout_seconds": 0}, "/timeout_seconds"),
        ({"tool_scope": "specified", "employees": []}, "/employees"),
        ({"tool_scope": "specified", "employees": ["nobody"]}, "/employees/0"),
        ({"packages": ["ok-pkg", "bad pkg; rm -rf"]}, "/packages/1"),
        ({"archive_base64": base64.b64encode(b"not a zip").decode()}, "/archive"),
        ({"source": "local-dir", "source_ref": "relative/dir"}, "/source_ref"),
    ],
)
def test_an_invalid_definition_is_refused_with_a_pointer(
    operator_client: APIClient, overrides: dict[str, Any], pointer: str
) -> None:
    response = operator_client.post("/api/v1/skills", body(**overrides), format="json")
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == PROBLEM
    assert pointer in pointers(response)
    assert not Skill.objects.exists()


def test_the_tool_name_is_immutable(
    operator_client: APIClient, make_skill: Callable[..., Skill]
) -> None:
    make_skill()
    response = operator_client.patch(
        "/api/v1/skills/py_add", {"tool_name": "renamed"}, format="json"
    )
    assert response.status_code == 409
    ok = operator_client.patch("/api/v1/skills/py_add", {"title": "Sum"}, format="json")
    assert ok.status_code == 200 and ok.json()["title"] == "Sum"


def test_an_update_is_validated_as_a_whole(
    operator_client: APIClient, make_skill: Callable[..., Skill]
) -> None:
    make_skill()
    response = operator_client.patch(
        "/api/v1/skills/py_add", {"code_template": "print({{c}})"}, format="json"
    )
    assert response.status_code == 400
    assert pointers(response) == ["/code_template"]
    assert Skill.objects.get().code_template == PY_ADD


def test_a_skill_with_executions_cannot_be_deleted(
    operator_client: APIClient, make_skill: Callable[..., Skill]
) -> None:
    skill = make_skill()
    other = make_skill("py_other")
    execution_request(
        skill=skill, inputs={"a": 1}, caller=Caller.for_user(_operator()), origin="api"
    )
    assert operator_client.delete("/api/v1/skills/py_add").status_code == 409
    assert operator_client.delete(f"/api/v1/skills/{other.tool_name}").status_code == 204


def _operator() -> Any:
    from orchestrator.accounts.roles import Role
    from orchestrator.accounts.services import user_ensure

    return user_ensure(username="operator", roles=[Role.OPERATOR])


def test_inputs_are_validated_before_anything_is_queued(
    operator_client: APIClient, make_skill: Callable[..., Skill]
) -> None:
    make_skill()
    response = operator_client.post(
        "/api/v1/skills/py_add/test", {"inputs": {"a": "one", "c": 3}}, format="json"
    )
    assert response.status_code == 400, response.content
    assert set(pointers(response)) == {"/inputs/a", "/inputs"}
    assert not SkillExecution.objects.exists()


def test_a_disabled_skill_is_refused(
    operator_client: APIClient, make_skill: Callable[..., Skill]
) -> None:
    make_skill(enabled=False)
    response = operator_client.post(
        "/api/v1/skills/py_add/test", {"inputs": {"a": 1}, "wait_seconds": 0}, format="json"
    )
    assert response.status_code == 403
    assert "disabled" in response.json()["detail"]


def test_a_viewer_may_not_run_a_skill(
    viewer_client: APIClient, make_skill: Callable[..., Skill]
) -> None:
    make_skill()
    response = viewer_client.post(
        "/api/v1/skills/py_add/test", {"inputs": {"a": 1}, "wait_seconds": 0}, format="json"
    )
    assert response.status_code == 403


def test_the_per_user_rate_limit_answers_429_with_a_clear_problem(
    operator_client: APIClient, make_skill: Callable[..., Skill], settings: Any
) -> None:
    settings.SKILLHUB = {**settings.SKILLHUB, "RATE_LIMIT_PER_MINUTE": 2}
    make_skill()
    request = {"inputs": {"a": 1}, "wait_seconds": 0}
    for _ in range(2):
        assert (
            operator_client.post("/api/v1/skills/py_add/test", request, format="json").status_code
            == 202
        )
    refused = operator_client.post("/api/v1/skills/py_add/test", request, format="json")
    assert refused.status_code == 429
    assert refused["Content-Type"] == PROBLEM
    problem = refused.json()
    assert problem["type"].endswith("/rate-limited")
    assert problem["limit_per_minute"] == 2 and problem["retry_after_seconds"] >= 1
    assert "user:operator" in problem["detail"]
    assert SkillExecution.objects.count() == 2


def test_execution_pins_defaults_and_the_rendered_program(
    make_skill: Callable[..., Skill],
) -> None:
    skill = make_skill()
    execution = execution_request(
        skill=skill, inputs={"a": 4}, caller=Caller.for_user(_operator()), origin="api"
    )
    assert execution.inputs == {"a": 4, "b": 1}
    assert "{{" not in execution.code and 'loads("4")' in execution.code
    assert execution.status == "queued" and execution.network == "deny"


def _employee(username: str, tools: list[str]) -> None:
    endpoint = model_endpoint_create(
        name=f"ep-{username}", provider="openai", base_url="http://127.0.0.1:9/v1", model="m"
    )
    employee_create(username=username, endpoint=endpoint, tools=tools)


def _harness(**tools: Any) -> dict[str, Any]:
    from harness.schema import DEFAULT_PLATFORM

    settings = {k: dict(v) for k, v in DEFAULT_PLATFORM.items()}
    settings["tools"] = {**settings["tools"], **tools}
    settings["isolation"]["networkAccess"] = "deny"
    return settings


@pytest.mark.parametrize(
    ("scope", "employees", "bound", "allowed"),
    [
        ("general", [], [], True),
        ("specified", ["ann"], [], True),
        ("specified", ["bob"], [], False),
        ("custom", [], ["skill_hub_py_add"], True),
        ("custom", [], ["skill_hub_execute"], False),
    ],
)
def test_tool_scope_decides_which_employees_may_run_a_skill(
    make_skill: Callable[..., Skill],
    scope: str,
    employees: list[str],
    bound: list[str],
    allowed: bool,
) -> None:
    _employee("ann", bound)
    _employee("bob", [])
    skill = make_skill(tool_scope=scope, employees=employees)
    caller = Caller.for_employee("ann", harness=_harness(allow=["*"]), bound_tools=frozenset(bound))
    if allowed:
        assert execution_request(skill=skill, inputs={"a": 1}, caller=caller, origin="agent")
    else:
        with pytest.raises(SkillForbidden, match="not available to employee 'ann'"):
            execution_request(skill=skill, inputs={"a": 1}, caller=caller, origin="agent")


def test_the_harness_can_deny_a_skill_and_gates_the_generic_tool(
    make_skill: Callable[..., Skill],
) -> None:
    skill = make_skill()
    denied = Caller.for_employee(
        "ann", harness=_harness(allow=["*"], deny=["skill_hub_py_add"]), bound_tools=frozenset()
    )
    with pytest.raises(SkillForbidden, match="harness denies skill_hub_py_add"):
        execution_request(skill=skill, inputs={"a": 1}, caller=denied, origin="agent")
    asks = Caller.for_employee("ann", harness=_harness(allow=[]), bound_tools=frozenset())
    with pytest.raises(SkillForbidden, match="requires approval"):
        execution_request(skill=skill, inputs={"a": 1}, caller=asks, origin="agent", generic=True)


def test_the_network_follows_the_callers_harness(make_skill: Callable[..., Skill]) -> None:
    skill = make_skill()
    harness = _harness(allow=["*"])
    harness["isolation"] = {**harness["isolation"], "networkAccess": "allow"}
    caller = Caller.for_employee("ann", harness=harness, bound_tools=frozenset())
    execution = execution_request(skill=skill, inputs={"a": 1}, caller=caller, origin="agent")
    assert execution.network == "allow"


def test_every_template_is_a_valid_skill(operator_client: APIClient) -> None:
    listed = operator_client.get("/api/v1/skills/listTemplates").json()
    assert [t["key"] for t in listed] == [t["key"] for t in TEMPLATES]
    for template in listed:
        fields = {k: template[k] for k in ("title", "language", "code_template", "input_schema")}
        skill_create(actor="test", tool_name=template["key"].replace("-", "_"), **fields)


def test_mcp_list_tools_shows_enabled_skills_as_mcp_tools(
    viewer_client: APIClient, make_skill: Callable[..., Skill]
) -> None:
    make_skill()
    make_skill("py_off", enabled=False)
    make_skill("py_read", auto_call=True)
    tools = viewer_client.get("/api/v1/skills/mcpListTools").json()
    assert [t["name"] for t in tools] == ["py_add", "py_read"]
    add, read = tools
    assert (add["description"], add["inputSchema"]) == ("The py_add skill", NUMBERS)
    assert add["outputSchema"] == EXECUTION_SUMMARY_SCHEMA
    assert add["annotations"] == {
        "title": "py add", "readOnlyHint": False, "destructiveHint": True,
        "idempotentHint": False, "openWorldHint": False,
    }  # fmt: skip
    assert read["annotations"] == {"title": "py read", "readOnlyHint": True, "openWorldHint": False}


def test_a_zip_archive_is_accepted_and_unsafe_paths_are_not(operator_client: APIClient) -> None:
    def zipped(name: str) -> str:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as zf:
            zf.writestr(name, "data")
        return base64.b64encode(buffer.getvalue()).decode()

    ok = operator_client.post(
        "/api/v1/skills", body(archive_base64=zipped("data/x.txt")), format="json"
    )
    assert ok.status_code == 201 and ok.json()["has_archive"] is True
    bad = operator_client.post(
        "/api/v1/skills", body(tool_name="evil", archive_base64=zipped("../x")), format="json"
    )
    assert bad.status_code == 400 and "/archive" in pointers(bad)


def test_output_files_download_within_the_size_limit(
    viewer_client: APIClient, make_skill: Callable[..., Skill], settings: Any
) -> None:
    skill = make_skill()
    execution = execution_request(
        skill=skill, inputs={"a": 1}, caller=Caller.for_user(_operator()), origin="api"
    )
    SkillOutputFile.objects.create(execution=execution, name="report.txt", size=5, data=b"hello")
    SkillOutputFile.objects.create(execution=execution, name="huge.bin", size=10**9, data=None)
    base = f"/api/v1/skill-executions/{execution.id}"
    got = viewer_client.get(f"{base}/download", {"name": "report.txt"})
    assert got.status_code == 200 and got.content == b"hello"
    assert 'filename="report.txt"' in got["Content-Disposition"]
    assert viewer_client.get(f"{base}/download", {"name": "huge.bin"}).status_code == 409
    assert viewer_client.get(f"{base}/download", {"name": "nope"}).status_code == 404
    settings.SKILLHUB = {**settings.SKILLHUB, "DOWNLOAD_MAX_BYTES": 4}
    assert viewer_client.get(f"{base}/download", {"name": "report.txt"}).status_code == 409
    listed = viewer_client.get("/api/v1/skill-executions", {"skill": "py_add"}).json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert rows[0]["output_files"][0] == {"name": "huge.bin", "size": 10**9, "downloadable": False}
    assert viewer_client.get("/api/v1/skill-executions/not-a-uuid").status_code == 400


def test_the_openapi_schema_documents_the_skill_hub(admin_client_api: APIClient) -> None:
    schema = admin_client_api.get("/api/schema/", {"format": "json"}).json()
    paths = schema["paths"]
    for path in (
        "/api/v1/skills",
        "/api/v1/skills/{tool_name}/test",
        "/api/v1/skills/mcpCallTool",
        "/api/v1/skills/gitSyncSkills",
        "/api/v1/skill-executions/{id}/download",
    ):
        assert path in paths, path
    assert "429" in paths["/api/v1/skills/{tool_name}/test"]["post"]["responses"]


def test_a_review_template_is_stored_per_skill(
    operator_client: APIClient, viewer_client: APIClient, make_skill: Callable[..., Skill]
) -> None:
    make_skill()
    assert operator_client.get("/api/v1/skills/py_add/review").status_code == 404
    config = {"requires_review": True, "review_prompt": "Check it", "review_schema": None}
    saved = operator_client.put("/api/v1/skills/py_add/review", config, format="json")
    assert saved.status_code == 200, saved.content
    assert viewer_client.get("/api/v1/skills/py_add/review").json()["review_prompt"] == "Check it"
    assert (
        viewer_client.put("/api/v1/skills/py_add/review", config, format="json").status_code == 403
    )


def test_mcp_call_tool_on_an_unknown_skill_is_a_404(operator_client: APIClient) -> None:
    response = operator_client.post(
        "/api/v1/skills/mcpCallTool", {"name": "skill_hub_nope", "arguments": {}}, format="json"
    )
    assert response.status_code == 404
    assert "nope" in response.json()["detail"]
