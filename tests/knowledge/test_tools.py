"""The knowledge tools with a real ToolContext and Invocation over real bases (full-text, in the
test database) and a real external RAG service on loopback (the ``external-http`` contract):

* ``knowledge_search`` answers numbered results, each with its source (base / document, score),
  and records one Retrieval attributed to the run's invocation;
* a base the employee may not read is refused, naming the knowledge access matrix;
* no hit says so; a call outside a run or chat is refused;
* ``external_rag_search`` searches only the external RAG bases;
* both are read tools of the production registry, planned by the harness like any other tool,
  and a profile may name them.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from harness.planner import plan_tools
from harness.services import harness_snapshot, profile_create
from knowledge.models import Retrieval
from knowledge.services import document_add, knowledge_access_grant, knowledge_base_create
from knowledge.tools import EXTERNAL_RAG_SEARCH, KNOWLEDGE_SEARCH, KNOWLEDGE_TOOLS
from orchestrator.agents.wiring import employee_tool_registry
from runtime.tools.base import Invocation, ToolContext, ToolError, ToolResult
from runtime.types import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("seeded_profiles")]
EMPLOYEE = "kb-maker"
RUN = uuid.UUID("00000000-0000-4000-8000-00000000cafe")
LEAVE = "Employees take 30 days of paid leave a year; unused days carry over to March."
DEPLOY = "Deploys go out on Tuesdays after the release review; hotfixes any day."
SALARIES = "The salary bands of 2025 are confidential."


# --- bases, through the knowledge services ----------------------------------------------------


def local_base(key: str, documents: dict[str, str]) -> None:
    """A full-text base ``key`` holding ``documents`` (name -> Markdown text)."""
    base = knowledge_base_create(key=key, name=key.capitalize(), kind="local", actor="test")
    for name, text in documents.items():
        document_add(base=base, name=name, source=name, content_type="text/markdown", text=text,
                     actor="test")  # fmt: skip


def external_base(key: str, url: str) -> None:
    """An ``external-http`` RAG base whose service is at ``url``."""
    knowledge_base_create(
        key=key, name=key.capitalize(), kind="external_rag", provider="external-http",
        api_url=url, actor="test",
    )  # fmt: skip


def grant(employee: str, base: str) -> None:
    """Let ``employee`` read ``base`` (the knowledge access matrix)."""
    knowledge_access_grant(employee=employee, base=base, actor="test")


# --- a real external RAG service -----------------------------------------------------------------


class _RagHandler(BaseHTTPRequestHandler):
    server: RagServer

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.server.requests.append(body)
        results = [
            {"id": "c-7", "content": "Refunds are paid within 14 days of the return.",
             "score": 0.82, "metadata": {"filename": "refunds.pdf", "sourceUrl": "/files/7"}},
        ]  # fmt: skip
        payload = json.dumps({"results": results[: int(body.get("topK") or 5)]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class RagServer(ThreadingHTTPServer):
    """A real external RAG service on 127.0.0.1: ``POST /search`` answers one result."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _RagHandler)
        self.requests: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def rag() -> Iterator[RagServer]:
    server = RagServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02})
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture
def bases() -> None:
    local_base("handbook", {"leave.md": LEAVE, "deploys.md": DEPLOY})
    local_base("payroll", {"salaries.md": SALARIES})
    grant(EMPLOYEE, "handbook")


#: A role whose network reaches any host (a role without a harness reaches none).
OPEN = {"isolation": {"networkAccess": "allow", "allowedHosts": ["*"]}}


def invocation(employee: str = EMPLOYEE, name: str = "maker:0") -> Invocation:
    return Invocation(
        run_id=RUN, role="maker", name=name, employee=employee, user="dana", harness=OPEN
    )


def call(tool: str, arguments: dict[str, Any], who: Invocation | None = None) -> ToolResult:
    """The tool as the production registry gives it, called as a loop calls it."""
    found = employee_tool_registry().get(tool)
    assert found is not None, tool
    context = ToolContext(
        workdir=None,
        idempotency_key=f"{RUN}:1:0",
        deadline=time.monotonic() + 30,
        invocation=who if who is not None else invocation(),
    )
    return asyncio.run(found.run(arguments, context))


def refusal(tool: str, arguments: dict[str, Any], who: Invocation | None = None) -> str:
    with pytest.raises(ToolError) as refused:
        call(tool, arguments, who)
    return str(refused.value)


def test_a_search_answers_numbered_cited_results_and_is_recorded(bases: None) -> None:
    result = call(KNOWLEDGE_SEARCH, {"query": "paid leave days", "bases": ["handbook"]})
    assert not result.is_error
    text = result.content
    assert "[1] handbook / leave.md (score " in text, text
    assert LEAVE in text
    assert "Cite a result by its number and source" in text
    [row] = Retrieval.objects.all()
    assert (row.run_id, row.invocation, row.employee, row.user) == (
        RUN,
        "maker:0",
        EMPLOYEE,
        "dana",
    )
    assert (row.tool, row.query, row.bases, row.chat) == (
        KNOWLEDGE_SEARCH,
        "paid leave days",
        ["handbook"],
        False,
    )
    assert row.hits and row.hits[0]["base"] == "handbook" and row.hits[0]["document"] == "leave.md"
    assert row.error == ""


def test_without_bases_it_searches_every_base_the_employee_may_read(bases: None) -> None:
    text = call(KNOWLEDGE_SEARCH, {"query": "salary bands 2025", "top_k": 3}).content
    assert "payroll" not in text and SALARIES not in text
    [row] = Retrieval.objects.all()
    assert row.bases == ["handbook"]


def test_a_base_outside_the_access_matrix_is_refused_naming_it(bases: None) -> None:
    message = refusal(KNOWLEDGE_SEARCH, {"query": "salary bands", "bases": ["payroll"]})
    assert "access matrix" in message.lower(), message
    assert "payroll" in message
    assert SALARIES not in message


def test_no_hit_says_so(bases: None) -> None:
    text = call(KNOWLEDGE_SEARCH, {"query": "zebra migration", "bases": ["handbook"]}).content
    assert text.startswith('No results for "zebra migration"'), text


def test_a_call_outside_a_run_or_chat_is_refused(bases: None) -> None:
    found = employee_tool_registry().get(KNOWLEDGE_SEARCH)
    assert found is not None
    context = ToolContext(workdir=None, idempotency_key="k", deadline=time.monotonic() + 30)
    with pytest.raises(ToolError, match="only inside a run or a chat"):
        asyncio.run(found.run({"query": "leave"}, context))
    assert not Retrieval.objects.exists()


def test_a_chat_search_is_recorded_as_a_chat(bases: None) -> None:
    call(KNOWLEDGE_SEARCH, {"query": "deploys tuesday"}, invocation(name="chat"))
    [row] = Retrieval.objects.all()
    assert (row.chat, row.run_id, row.invocation) == (True, None, "chat")


def test_external_rag_search_keeps_to_the_external_bases(bases: None, rag: RagServer) -> None:
    external_base("support-rag", rag.url)
    grant(EMPLOYEE, "support-rag")
    text = call(EXTERNAL_RAG_SEARCH, {"query": "refund delay", "top_k": 2}).content
    assert "[1] support-rag / " in text and "Refunds are paid within 14 days" in text, text
    assert LEAVE not in text
    [row] = Retrieval.objects.all()
    assert (row.tool, row.bases) == (EXTERNAL_RAG_SEARCH, ["support-rag"])
    assert rag.requests and rag.requests[0]["query"] == "refund delay"

    message = refusal(EXTERNAL_RAG_SEARCH, {"query": "leave", "bases": ["handbook"]})
    assert "external RAG bases only" in message and "handbook" in message, message
    assert len(rag.requests) == 1


def test_the_roles_network_binds_the_call_to_an_external_service(
    bases: None, rag: RagServer
) -> None:
    external_base("support-rag", rag.url)
    grant(EMPLOYEE, "support-rag")

    def under(network: str, hosts: list[str]) -> Invocation:
        harness = {"isolation": {"networkAccess": network, "allowedHosts": hosts}}
        return Invocation(run_id=RUN, role="maker", name="maker:0", employee=EMPLOYEE,
                          user="dana", harness=harness)  # fmt: skip

    denied = refusal(EXTERNAL_RAG_SEARCH, {"query": "refund"}, under("deny", []))
    assert "isolation.networkAccess is deny" in denied and "support-rag" in denied, denied
    elsewhere = refusal(EXTERNAL_RAG_SEARCH, {"query": "refund"}, under("restricted", ["x.org"]))
    assert "not in its isolation.allowedHosts" in elsewhere, elsewhere
    assert rag.requests == []
    listed = call(EXTERNAL_RAG_SEARCH, {"query": "refund"}, under("restricted", ["127.0.0.1"]))
    assert "support-rag" in listed.content and len(rag.requests) == 1


def test_external_rag_search_refuses_external_bases_outside_the_matrix(
    bases: None, rag: RagServer
) -> None:
    external_base("support-rag", rag.url)
    message = refusal(EXTERNAL_RAG_SEARCH, {"query": "refund delay"})
    assert "access matrix" in message.lower(), message
    assert rag.requests == []


def test_both_are_read_tools_the_harness_plans_and_profiles_may_name() -> None:
    specs = {s.name: s for s in employee_tool_registry().specs()}
    assert {KNOWLEDGE_SEARCH, EXTERNAL_RAG_SEARCH} <= set(specs)
    assert [specs[n].effect for n in (KNOWLEDGE_SEARCH, EXTERNAL_RAG_SEARCH)] == [Effect.READ] * 2
    assert KNOWLEDGE_TOOLS.review_gates([KNOWLEDGE_SEARCH, EXTERNAL_RAG_SEARCH]) == {}
    tools = [specs[KNOWLEDGE_SEARCH], specs[EXTERNAL_RAG_SEARCH]]
    default = plan_tools(harness_snapshot(tag="default")["settings"], tools)
    assert default.decisions() == {
        KNOWLEDGE_SEARCH: ("allow", "allowed read tool"),
        EXTERNAL_RAG_SEARCH: ("allow", "allowed read tool"),
    }
    # The seeded safe profile names only read and list: a search is not silently allowed.
    safe = plan_tools(harness_snapshot(tag="safe")["settings"], tools)
    assert safe.decision(EXTERNAL_RAG_SEARCH).value == "ask"
    # A profile may name it again, as the old safe profile did (allowed, raised to high-risk).
    seeds = importlib.import_module("harness.migrations.0002_seed_profiles").SEEDS
    settings = copy.deepcopy(seeds["safe"]["settings"])
    settings["tools"]["allow"] = ["list", "read", EXTERNAL_RAG_SEARCH]
    settings["tools"]["effects"] = {
        **settings["tools"].get("effects", {}),
        EXTERNAL_RAG_SEARCH: "external",
    }
    profile_create(tag="safe-with-rag", settings=settings, created_by="test")
    named = harness_snapshot(tag="safe-with-rag")["settings"]
    planned = plan_tools(named, tools).by_name[EXTERNAL_RAG_SEARCH]
    assert (planned.decision.value, planned.reason, planned.tier) == (
        "ask",
        "external effect needs approval",
        "high-risk",
    )
