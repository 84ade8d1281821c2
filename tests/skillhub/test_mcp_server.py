"""The MCP server at ``/mcp`` of the real ASGI app (``orchestrator.asgi``), served by uvicorn on
loopback and called with the official ``mcp`` client over streamable HTTP: tools/list gives
the enabled skills, tools/call runs a Python and a Node.js skill in a real skills worker and
returns content with the output file manifest (and structured content true to the tools' output
schema); tools carry annotations from the skill's effect; a call without a valid token gets a
401 saying what is wrong."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import pytest
from django.utils import timezone
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from orchestrator.accounts.models import ApiToken
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import (
    TOKEN_MALFORMED,
    TOKEN_REFUSED,
    api_token_create,
    user_ensure,
)
from orchestrator.errors import NO_CREDENTIALS
from skillhub.models import Skill, SkillExecution
from skillhub.services.calls import EXECUTION_SUMMARY_SCHEMA
from skillhub.services.skills import skill_create
from tests.skillhub.conftest import NODE_UPPER, NUMBERS, TEXT, SkillsWorker
from tests.support.asgi_server import uvicorn_thread

pytestmark = [
    pytest.mark.one_backend,
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
]
PY_FILES = (
    "import json, pathlib\n"
    "total = {{a}} + {{b}}\n"
    "pathlib.Path('out/total.json').write_text(json.dumps({'total': total}))\n"
    "print(total)\n"
)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from django.db import connections

    from orchestrator.asgi import application

    # Django closes a request's connection at its end only with CONN_MAX_AGE 0; otherwise the
    # server's threads would keep sessions open on the test database past the test.
    monkeypatch.setitem(connections["default"].settings_dict, "CONN_MAX_AGE", 0)

    with uvicorn_thread(application) as url:
        yield url
    gc.unfreeze()  # the app's lifespan froze this (test) process's heap: give it back


@pytest.fixture
def skills(make_skill: Callable[..., Skill]) -> None:
    make_skill(code_template=PY_FILES, description="Adds a and b, writes out/total.json")
    skill_create(
        actor="test", tool_name="node_upper", title="Upper", description="Upper-cases text",
        code_template=NODE_UPPER, language="node", input_schema=TEXT, timeout_seconds=20,
        auto_call=True,
    )  # fmt: skip
    make_skill("py_disabled", enabled=False)


def token(*roles: Role) -> str:
    name = "mcp-" + "-".join(r.value for r in roles)
    return api_token_create(user=user_ensure(username=name, roles=list(roles)), name="mcp")


async def _session(url: str, bearer: str, work: Callable[[Client], Any]) -> Any:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {bearer}"})
    async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client:
        return await work(client)


def test_tools_list_and_call_over_streamable_http(
    server: str, skills: None, skills_worker: SkillsWorker
) -> None:
    bearer = token(Role.OPERATOR)

    async def work(client: Client) -> Any:
        listed = await client.list_tools()
        py = await client.call_tool("py_add", {"a": 20, "b": 22})
        node = await client.call_tool("node_upper", {"text": "mcp"})
        bad = await client.call_tool("py_add", {"a": "x"})
        return listed, py, node, bad

    listed, py, node, bad = asyncio.run(_session(server, bearer, work))
    tools = {t.name: t for t in listed.tools}
    assert sorted(tools) == ["node_upper", "py_add"]
    assert tools["py_add"].input_schema == NUMBERS
    assert tools["node_upper"].description == "Upper-cases text"
    # The declared effect: auto_call is read-only; otherwise a write, destructive by default.
    # An operator without a harness gets no network: a closed world.
    upper, add = tools["node_upper"].annotations, tools["py_add"].annotations
    assert upper is not None and add is not None
    assert (upper.title, upper.read_only_hint, upper.open_world_hint) == ("Upper", True, False)
    assert upper.destructive_hint is None
    assert (add.read_only_hint, add.destructive_hint, add.idempotent_hint) == (False, True, False)
    assert tools["py_add"].output_schema == EXECUTION_SUMMARY_SCHEMA

    assert py.is_error is False, (py, skills_worker.log()[-3000:])
    assert py.content[0].text == "42\n"
    manifest = json.loads(py.content[1].text.removeprefix("output files: "))
    assert manifest["output_files"] == [{"name": "total.json", "size": 13, "downloadable": True}]
    execution = SkillExecution.objects.get(pk=manifest["execution_id"])
    assert (execution.origin, execution.principal) == ("mcp", "user:mcp-operator")
    assert bytes(execution.output_files.get().data) == b'{"total": 42}'

    assert node.is_error is False and node.content[0].text == "MCP\n"
    # The client validated these against the output schema; the summary is the structure.
    assert py.structured_content is not None and py.structured_content["status"] == "succeeded"
    assert bad.is_error is True and "/inputs/a" in json.dumps(bad.structured_content)


def test_a_viewer_lists_tools_but_may_not_call_them(server: str, skills: None) -> None:
    async def work(client: Client) -> Any:
        return await client.list_tools(), await client.call_tool("py_add", {"a": 1})

    listed, refused = asyncio.run(_session(server, token(Role.VIEWER), work))
    assert len(listed.tools) == 2
    assert refused.is_error is True and "operator role" in refused.content[0].text
    assert not SkillExecution.objects.exists()


def test_the_mcp_endpoint_needs_a_valid_api_token_and_says_what_is_wrong(server: str) -> None:
    revoked = token(Role.OPERATOR)
    ApiToken.objects.filter(prefix=revoked.split("_")[1]).update(revoked_at=timezone.now())
    cases = {
        "": NO_CREDENTIALS,
        "Bearer not-a-token": TOKEN_MALFORMED,
        "Bearer lw_nope_nope": TOKEN_REFUSED,
        f"Bearer {revoked}": TOKEN_REFUSED,
        "Basic dTpw": "The Authorization scheme 'Basic' is not accepted",
    }
    for header, detail in cases.items():
        response = httpx2.post(
            f"{server}/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={"Authorization": header, "Accept": "application/json, text/event-stream"},
        )
        assert response.status_code == 401
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["detail"].startswith(detail), (header, response.json())


def test_django_still_serves_everything_else(server: str) -> None:
    assert httpx2.get(f"{server}/healthz").status_code in (200, 503)
    assert httpx2.get(f"{server}/api/v1/skills").status_code == 401


def test_a_foreign_host_header_is_refused(server: str) -> None:
    response = httpx2.post(
        f"{server}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={
            "Authorization": f"Bearer {token(Role.OPERATOR)}",
            "Accept": "application/json, text/event-stream",
            "Host": "evil.example",
        },
    )
    assert response.status_code == 421
