"""The Skills pages of the UI (issue 8) through Django's test client: the list, the editor with
errors at the field (``tool_name`` immutable, the input schema and placeholders checked by
``skill_create`` / ``skill_update``), the test panel (bounded wait, "still running" with a link),
the execution history with output file downloads, and role checks on the server.

Executions are requested through the real ``execution_request`` and run in the real sandbox
in this process with ``execution_run`` (what a skills worker does); no worker is started here,
so an execution nobody runs stays queued, which is how the "still running" answer is shown.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from orchestrator.accounts.services import user_ensure
from skillhub.models import Skill, SkillExecution
from skillhub.services.access import Caller
from skillhub.services.executions import execution_request, execution_run
from skillhub.services.skills import skill_create
from tests.conftest import PERSONAS

# Transactional: a skill execution's progress thread writes on a connection of its own, which an
# open test transaction would hold off (SQLite's lock) until its busy timeout.
pytestmark = pytest.mark.django_db(transaction=True)
ClientAs = Callable[[str], Client]

NUMBERS = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "default": 1}},
    "required": ["a"],
    "additionalProperties": False,
}
SUM_WITH_FILE = (
    "import json, pathlib\n"
    "n = {{a}} + {{b}}\n"
    "pathlib.Path('out').mkdir(exist_ok=True)\n"
    "pathlib.Path('out/sum.json').write_text(json.dumps({'sum': n}))\n"
    "print(n)\n"
)


@pytest.fixture(autouse=True)
def _short_test_wait(settings: Any) -> None:
    """No skills worker runs here: the test panel gives up quickly and says so."""
    settings.LOOPWRIGHT_UI = {**settings.LOOPWRIGHT_UI, "SKILL_TEST_WAIT_SECONDS": 0.3}


@pytest.fixture
def skill() -> Skill:
    return skill_create(
        actor="test",
        tool_name="py_sum",
        title="Sum two numbers",
        description="Adds a and b",
        code_template=SUM_WITH_FILE,
        language="python",
        input_schema=NUMBERS,
        timeout_seconds=20,
    )


def html(response: Any) -> str:
    return str(response.content.decode())


def field_errors(page: str, name: str) -> str:
    """The error list rendered in one field's block (empty when the field has none)."""
    start = page.index(f'id="field-{name}"')
    end = page.find('id="field-', start + 1)
    block = page[start : end if end > 0 else len(page)]
    match = re.search(r'<ul class="field-errors".*?</ul>', block, flags=re.DOTALL)
    return match.group(0) if match else ""


def form_body(**overrides: Any) -> dict[str, Any]:
    body = {
        "tool_name": "py_double",
        "title": "Double it",
        "description": "Doubles a number",
        "instructions": "",
        "language": "python",
        "input_schema": json.dumps(
            {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        ),
        "code_template": "print({{n}} * 2)\n",
        "packages": "",
        "timeout_seconds": "15",
        "max_output_size_mb": "2",
        "enabled": "on",
        "tool_scope": "general",
        "employees": "",
    }
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not None}


def run_inline(skill: Skill, inputs: dict[str, Any], persona: str = "operator") -> SkillExecution:
    """Request an execution as ``persona`` and run it here in the real sandbox."""
    user = user_ensure(username=persona, roles=PERSONAS[persona])
    execution = execution_request(
        skill=skill, inputs=inputs, caller=Caller.for_user(user), origin="test"
    )
    done = execution_run(execution_id=execution.id, owner="ui-test")
    assert done is not None
    return done


# --- list -----------------------------------------------------------------------------------


def test_the_list_shows_every_skill_with_its_last_execution(
    skill: Skill, client_as: ClientAs
) -> None:
    run_inline(skill, {"a": 2})
    page = html(client_as("viewer").get("/skills"))
    row = page.split('id="skill-py_sum"')[1].split("</tr>")[0]
    for fragment in ('href="/skills/py_sum"', "Sum two numbers", "Python", "general", "20 s"):
        assert fragment in row, fragment
    assert 'data-status="succeeded"' in row and "/skills/py_sum/executions/" in row
    assert 'aria-current="page"' in page.split('href="/skills"')[1][:30]  # the nav link
    assert "New skill" not in page  # a viewer is offered no write
    assert "New skill" in html(client_as("operator").get("/skills"))


def test_the_list_says_so_when_there_are_no_skills(client_as: ClientAs) -> None:
    page = html(client_as("operator").get("/skills"))
    assert "No skills yet." in page and 'href="/skills/new"' in page


# --- create ---------------------------------------------------------------------------------


def test_an_operator_creates_a_skill(client_as: ClientAs) -> None:
    client = client_as("operator")
    assert client.get("/skills/new").status_code == 200
    response = client.post(
        "/skills/new",
        form_body(tool_scope="general", packages="requests\nrich", enabled=None),
    )
    assert response.status_code == 302, html(response)
    assert response["Location"] == "/skills/py_double"
    skill = Skill.objects.get(tool_name="py_double")
    assert (skill.title, skill.language, skill.timeout_seconds, skill.max_output_size_mb) == (
        "Double it",
        "python",
        15,
        2,
    )
    assert skill.packages == ["requests", "rich"] and skill.enabled is False
    assert skill.created_by == "operator"
    page = html(client.get("/skills/py_double"))
    assert "Skill py_double created." in page and "skill_hub_py_double" in page
    assert "This skill has not run yet." in page


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"tool_name": "Bad-Name"}, "tool_name", "must match"),
        ({"input_schema": '{"type": "object",'}, "input_schema", "Not valid JSON"),
        ({"input_schema": '{"type": "string"}'}, "input_schema", "must describe an object"),
        (
            {"input_schema": '{"type": "object", "properties": {"n": {"type": 5}}}'},
            "input_schema",
            "not a valid JSON Schema",
        ),
        ({"code_template": "print({{m}})"}, "code_template", "placeholder {{m}} is not a"),
        ({"code_template": ""}, "code_template", "This field is required."),
        ({"timeout_seconds": "0"}, "timeout_seconds", "must be between 1 and 600"),
        ({"max_output_size_mb": "101"}, "max_output_size_mb", "must be between 1 and 100"),
        ({"language": "ruby"}, "language", "Select a valid choice"),
        ({"tool_scope": "specified", "employees": ""}, "employees", "at least one employee"),
        ({"tool_scope": "specified", "employees": "ghost"}, "employees", "0: no employee"),
    ],
)
def test_a_bad_skill_is_refused_with_the_message_at_its_field(
    overrides: dict[str, Any], field: str, message: str, client_as: ClientAs
) -> None:
    response = client_as("operator").post("/skills/new", form_body(**overrides))
    assert response.status_code == 400
    page = html(response)
    assert "Please correct the fields marked below." in page
    errors = field_errors(page, field)
    assert message in errors.replace("&#x27;", "'").replace("&quot;", '"'), (field, errors)
    assert not Skill.objects.exists()


def test_a_taken_tool_name_is_refused_at_the_field(skill: Skill, client_as: ClientAs) -> None:
    response = client_as("operator").post("/skills/new", form_body(tool_name="py_sum"))
    assert response.status_code == 400
    assert "already exists" in field_errors(html(response), "tool_name")
    assert Skill.objects.count() == 1


# --- edit -----------------------------------------------------------------------------------


def test_an_operator_edits_a_skill(skill: Skill, client_as: ClientAs) -> None:
    client = client_as("operator")
    page = html(client.get("/skills/py_sum/edit"))
    assert re.search(r'<input[^>]*name="tool_name"[^>]*readonly', page)
    assert "Sum two numbers" in page and "&quot;additionalProperties&quot;: false" in page
    body = form_body(
        tool_name="py_sum",
        title="Sum, renamed",
        input_schema=json.dumps(NUMBERS),
        code_template=SUM_WITH_FILE,
        timeout_seconds="40",
        tool_scope="custom",
        auto_call="on",
    )
    response = client.post("/skills/py_sum/edit", body)
    assert response.status_code == 302, html(response)
    skill.refresh_from_db()
    assert (skill.title, skill.timeout_seconds, skill.tool_scope, skill.auto_call) == (
        "Sum, renamed",
        40,
        "custom",
        True,
    )
    assert "Skill py_sum saved." in html(client.get("/skills/py_sum"))


def test_the_tool_name_cannot_change(skill: Skill, client_as: ClientAs) -> None:
    body = form_body(
        tool_name="py_other",
        title="Sneaky",
        input_schema=json.dumps(NUMBERS),
        code_template=SUM_WITH_FILE,
    )
    response = client_as("operator").post("/skills/py_sum/edit", body)
    assert response.status_code == 400
    assert "tool_name is immutable" in field_errors(html(response), "tool_name")
    skill.refresh_from_db()
    assert skill.title == "Sum two numbers"
    assert list(Skill.objects.values_list("tool_name", flat=True)) == ["py_sum"]


def test_an_edit_that_breaks_the_placeholders_is_refused_at_the_field(
    skill: Skill, client_as: ClientAs
) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = form_body(
        tool_name="py_sum", input_schema=json.dumps(schema), code_template=SUM_WITH_FILE
    )
    response = client_as("operator").post("/skills/py_sum/edit", body)
    assert response.status_code == 400
    assert "placeholder {{b}} is not a property" in field_errors(html(response), "code_template")
    skill.refresh_from_db()
    assert skill.input_schema == NUMBERS


def test_an_unknown_skill_is_a_404_page(client_as: ClientAs) -> None:
    for path in ("/skills/nope", "/skills/nope/edit", "/skills/nope/test"):
        response = client_as("operator").get(path)
        assert response.status_code == 404, path
        assert "There is no skill" in html(response)


# --- test panel -----------------------------------------------------------------------------


def test_the_test_panel_says_when_the_execution_is_still_running_and_links_to_it(
    skill: Skill, client_as: ClientAs
) -> None:
    client = client_as("operator")
    page = html(client.get("/skills/py_sum/test"))
    assert "&quot;b&quot;: 1" in page  # starts from the schema's defaults
    response = client.post("/skills/py_sum/test", {"inputs": '{"a": 4, "b": 5}'})
    assert response.status_code == 302
    execution = SkillExecution.objects.get()
    assert response["Location"] == f"/skills/py_sum/test?execution={execution.id}"
    assert (execution.status, execution.origin, execution.principal) == (
        "queued",
        "test",
        "user:operator",
    )
    page = html(client.get(response["Location"]))
    assert "Still queued" in page
    assert f'href="/skills/py_sum/executions/{execution.id}"' in page
    assert "&quot;a&quot;: 4" in page  # the form keeps the inputs for another run

    # A skills worker would run it; here it runs inline, and its page shows the result.
    execution_run(execution_id=execution.id, owner="ui-test")
    page = html(client.get(f"/skills/py_sum/executions/{execution.id}"))
    assert "Still" not in page
    assert 'data-status="succeeded"' in page and ">9\n</pre>" in page
    assert f"/skills/py_sum/executions/{execution.id}/download?name=sum.json" in page


def test_inputs_off_the_schema_are_shown_at_the_field_and_run_nothing(
    skill: Skill, client_as: ClientAs
) -> None:
    client = client_as("operator")
    response = client.post("/skills/py_sum/test", {"inputs": '{"a": "two"}'})
    assert response.status_code == 400
    assert "a: &#x27;two&#x27; is not of type &#x27;integer&#x27;" in field_errors(
        html(response), "inputs"
    )
    response = client.post("/skills/py_sum/test", {"inputs": '{"a": 1'})
    assert response.status_code == 400
    assert "Not valid JSON" in field_errors(html(response), "inputs")
    assert not SkillExecution.objects.exists()


def test_a_disabled_skill_cannot_be_tested(skill: Skill, client_as: ClientAs) -> None:
    Skill.objects.filter(pk=skill.pk).update(enabled=False)
    response = client_as("operator").post("/skills/py_sum/test", {"inputs": '{"a": 1}'})
    assert response.status_code == 400
    assert "is disabled" in html(response)
    assert not SkillExecution.objects.exists()


# --- history and downloads ------------------------------------------------------------------


def test_the_history_lists_executions_newest_first_with_their_files(
    skill: Skill, client_as: ClientAs
) -> None:
    first = run_inline(skill, {"a": 1})
    second = run_inline(skill, {"a": 10, "b": 20})
    assert (first.status, second.status) == ("succeeded", "succeeded")
    page = html(client_as("viewer").get("/skills/py_sum"))
    assert 'Executions <span class="muted">(2, newest first)' in page
    assert page.index(f'id="history-{second.id}"') < page.index(f'id="history-{first.id}"')
    row = page.split(f'id="history-{second.id}"')[1].split("</tr>")[0]
    assert 'data-status="succeeded"' in row and "user:operator" in row
    assert f"/skills/py_sum/executions/{second.id}/download?name=sum.json" in row
    assert "Test" not in page.split('class="page-head"')[1].split("</div>")[0]  # viewer


def test_output_files_download_for_every_role(skill: Skill, client_as: ClientAs) -> None:
    execution = run_inline(skill, {"a": 2, "b": 3})
    url = f"/skills/py_sum/executions/{execution.id}/download"
    response = client_as("viewer").get(url, {"name": "sum.json"})
    assert response.status_code == 200
    assert json.loads(response.content) == {"sum": 5}
    assert response["Content-Disposition"] == 'attachment; filename="sum.json"'
    missing = client_as("viewer").get(url, {"name": "nope.txt"})
    assert missing.status_code == 404 and "has no output file" in html(missing)
    bad_id = client_as("viewer").get("/skills/py_sum/executions/not-a-uuid")
    assert bad_id.status_code == 404
    assert client_as("outsider").get(url, {"name": "sum.json"}).status_code == 403


def test_a_failed_execution_shows_its_stderr_and_exit_status(client_as: ClientAs) -> None:
    failing = skill_create(
        actor="test",
        tool_name="py_fail",
        title="Fails",
        code_template="import sys\nprint('oops', file=sys.stderr)\nsys.exit(3)\n",
        language="python",
        input_schema={"type": "object", "properties": {}},
        timeout_seconds=20,
    )
    execution = run_inline(failing, {})
    page = html(client_as("viewer").get(f"/skills/py_fail/executions/{execution.id}"))
    assert 'data-status="failed"' in page
    assert re.search(r'class="execution-exit">3\b', page)
    assert "oops" in page and "the program exited with status 3" in page


# --- roles ----------------------------------------------------------------------------------


@pytest.mark.parametrize("persona", ["viewer", "approver"])
def test_roles_without_operator_are_refused_every_skill_write(
    persona: str, skill: Skill, client_as: ClientAs
) -> None:
    client = client_as(persona)
    posts = {
        "/skills/new": form_body(),
        "/skills/py_sum/edit": form_body(tool_name="py_sum", title="Changed"),
        "/skills/py_sum/test": {"inputs": '{"a": 1}'},
    }
    for url, body in posts.items():
        response = client.post(url, body)
        assert response.status_code == 403, url
        assert b"needs the operator role" in response.content, url
        assert client.get(url).status_code == 403, url  # form pages only serve the write
    skill.refresh_from_db()
    assert skill.title == "Sum two numbers"
    assert Skill.objects.count() == 1 and not SkillExecution.objects.exists()
    assert client.get("/skills/py_sum").status_code == 200


def test_an_admin_may_write_skills_too(skill: Skill, client_as: ClientAs) -> None:
    response = client_as("admin").post("/skills/new", form_body())
    assert response.status_code == 302
    assert Skill.objects.filter(tool_name="py_double", created_by="admin").exists()
