"""The issue's acceptance: a run whose maker searches a base it may read gets cited chunks; a
base it may not read is refused with the knowledge access matrix named.

The run is triggered as the API does and driven in this process by the production ``drive_run``
with the production ``AgentInvoker`` (the employee's rows and bound tools, the harness policy of
the run's snapshot, the production tool registry with the knowledge provider, the
OpenAI-compatible client) against the scripted model server on loopback; only the driver's
thread pool is replaced by inline calls. The tool reads the bases on its own database thread, as
in a worker, so the test is transactional. What a person checks: the maker's tool steps (their
results as the model read them), the Retrieval rows of the run, the run page's Retrievals panel
and the run's spans (kind ``retrieval``).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest
from django.db import DEFAULT_DB_ALIAS, connections
from django.test import Client

from knowledge.models import Retrieval
from knowledge.tools import KNOWLEDGE_SEARCH
from loops.models import LoopRun, LoopStep, RunStatus
from loops.services.claims import run_claim
from loops.services.runs import run_trigger
from loops.services.spans import run_spans
from loops.worker.engine import drive_run
from loops.worker.invoker import AgentInvoker
from orchestrator.agents.services import employee_create, model_endpoint_create
from tests.knowledge.test_tools import DEPLOY, LEAVE, SALARIES, grant, local_base
from tests.support.approvals import LEADER, MAKER, VERIFIER, approval_pattern, http_reply
from tests.support.model_server import ModelServer
from tests.ui.conftest import make_user

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(300),
]
READABLE = {"query": "how many days of paid leave", "bases": ["handbook"], "top_k": 2}
FORBIDDEN = {"query": "salary bands", "bases": ["payroll"]}


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer() as server:
        server.always(http_reply)
        yield server
    server.check()


@pytest.fixture
def team(model: ModelServer) -> None:
    endpoint = model_endpoint_create(
        name="kb-loopback", provider="openai", base_url=model.url, model="kb-script",
        max_retries=0, timeout_seconds=60,
    )  # fmt: skip
    for username in (LEADER, VERIFIER):
        employee_create(username=username, endpoint=endpoint, tools=["read", "list"])
    employee_create(username=MAKER, endpoint=endpoint, tools=["read", KNOWLEDGE_SEARCH])
    local_base("handbook", {"leave.md": LEAVE, "deploys.md": DEPLOY})
    local_base("payroll", {"salaries.md": SALARIES})
    grant(MAKER, "handbook")


class _Driver:
    """What ``drive_run`` needs of a RunDriver, its database calls inline."""

    def __init__(self, invoker: AgentInvoker) -> None:
        self.invoker = invoker

    async def db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


def drive(run_id: uuid.UUID) -> str:
    """Claim the run and drive it with the production invoker until it ends or parks."""
    [claim] = run_claim(owner="kb-test", lease_seconds=300, run_id=run_id)
    outer = connections[DEFAULT_DB_ALIAS]

    async def main() -> None:
        connections[DEFAULT_DB_ALIAS] = outer
        await drive_run(_Driver(AgentInvoker()), claim)  # type: ignore[arg-type]

    with mock.patch.dict(os.environ, {"DJANGO_ALLOW_ASYNC_UNSAFE": "true"}):
        asyncio.run(main())
    return str(LoopRun.objects.get(pk=run_id).status)


def test_the_maker_gets_cited_chunks_of_its_base_and_a_refusal_naming_the_matrix(
    team: None, model: ModelServer
) -> None:
    pattern = approval_pattern("kb-run")
    rounds = [[[KNOWLEDGE_SEARCH, READABLE]], [[KNOWLEDGE_SEARCH, FORBIDDEN]]]
    run = run_trigger(pattern=pattern, actor="test", inputs={"label": "kb", "rounds": rounds})
    status = drive(run.id)
    assert status == RunStatus.SUCCEEDED, (status, LoopRun.objects.get(pk=run.id).failure_reason)

    # The maker was offered the tool it binds, planned as a read (no approval).
    offered = [
        {t["function"]["name"] for t in body.get("tools") or []}
        for body in model.bodies
        if "You are a maker" in json.dumps(body["messages"][:1])
    ]
    assert offered and all(KNOWLEDGE_SEARCH in names for names in offered), offered

    found, refused = LoopStep.objects.filter(run=run, kind="tool").order_by("seq")
    assert (found.name, found.status, found.role) == (KNOWLEDGE_SEARCH, "completed", "maker")
    cited = found.response["content"]
    assert "[1] handbook / leave.md (score " in cited and LEAVE in cited, cited
    assert refused.name == KNOWLEDGE_SEARCH
    said = f"{refused.error} {refused.response}"
    assert "access matrix" in said.lower() and "payroll" in said, said
    assert SALARIES not in said
    # The model read both answers as the calls' results.
    read = [m["content"] for b in model.bodies for m in b["messages"] if m.get("role") == "tool"]
    assert any("[1] handbook / leave.md" in str(c) for c in read), read
    assert any("access matrix" in str(c).lower() for c in read), read

    rows = list(Retrieval.objects.filter(run_id=run.id).order_by("created_at"))
    assert [(r.tool, r.employee, r.invocation) for r in rows] == [
        (KNOWLEDGE_SEARCH, MAKER, "maker:0"),
    ] * len(rows)
    assert rows[0].bases == ["handbook"] and rows[0].hits[0]["document"] == "leave.md"
    assert rows[0].error == ""
    if len(rows) == 2:  # a refusal is recorded too, with why
        assert "access matrix" in rows[1].error.lower()

    # The run's spans show the searches as retrievals.
    kinds = {s.name: s.kind for s in run_spans(LoopRun.objects.get(pk=run.id)).spans}
    assert kinds[KNOWLEDGE_SEARCH] == "retrieval"

    # The run page's Retrievals panel lists them for any reader.
    viewer = Client()
    viewer.force_login(make_user("viewer"))
    page = viewer.get(f"/runs/{run.id}")
    assert page.status_code == 200
    text = page.content.decode()
    assert 'id="retrievals"' in text and f'id="retrieval-{rows[0].pk}"' in text
    assert "how many days of paid leave" in text and "leave.md" in text
