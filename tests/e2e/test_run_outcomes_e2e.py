"""How runs end, end to end: real ``celery worker`` processes drive the production AgentInvoker
against the loopback OpenAI-compatible model server; runs are triggered, decided and accepted
over the REST API.

* verifier pass / reject / escalate at L1 and at L2 (pass at L2 waits for a human to accept);
* an L2 run in its own git worktree: the maker's gated write is approved, the change is the
  run's ``changes.diff`` artifact;
* approval timeout (``celery beat`` sends the reaper): ``onTimeout: reject`` tells the model the
  request *timed out* and the run goes on; ``escalate`` hands the run to a human;
* the pattern circuit breaker trips after consecutive failed runs, refuses triggers, lets one
  probe through after the cooldown and closes when the probe succeeds.

The scripted model is a pure function of the conversation (``tests.support.approvals``): the
maker proposes ``inputs["rounds"]``; here the verifier answers ``inputs["verdict"]`` and the
leader of a run with ``inputs["slow"]`` takes that many seconds to answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from loops.models import ActionApproval, CircuitState, LoopEvent, LoopRun, LoopStep, RunStatus
from loops.services.workspaces import workspace_path
from orchestrator.management.commands.seed_demo import ensure_demo_repository
from tests.e2e.conftest import start_beat, start_worker
from tests.support.approvals import (
    approval_pattern,
    audit_problems,
    http_reply,
    inputs_of,
    loopback_team,
    role_of,
    tool_results,
    write_call,
)
from tests.support.model_server import Completion, Delay, ModelServer, RecordedRequest
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(600),
]
AGENT = {"LOOPWRIGHT_INVOKER": "loops.worker.invoker.AgentInvoker"}
WAIT = 180  # generous: the machine is shared and loaded; the assertions stay strict
STOPPED = (
    RunStatus.SUCCEEDED,
    RunStatus.FAILED,
    RunStatus.CANCELED,
    RunStatus.WAITING_HUMAN,
    RunStatus.BLOCKED,
)
GREETING = "Hello, end-to-end world.\n"


def verdict(value: str, *reasons: str) -> dict[str, Any]:
    return {"verdict": value, "reasons": list(reasons) or [f"scripted {value}"], "checks": []}


def reply(request: RecordedRequest) -> Completion | Delay:
    """``http_reply``, but the verifier says ``inputs["verdict"]`` when the run gives one and
    the leader waits ``inputs["slow"]`` seconds before planning."""
    messages = request.body["messages"]
    role, inputs = role_of(messages), inputs_of(messages)
    if role == "verifier" and inputs.get("verdict"):
        return Completion(content=json.dumps(inputs["verdict"]), model="outcomes-script")
    answer = http_reply(request)
    if role == "leader" and inputs.get("slow"):
        return Delay(float(inputs["slow"]), answer)
    return answer


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer() as server:
        server.always(reply)
        yield server
    server.check()


@pytest.fixture
def team(model: ModelServer) -> None:
    loopback_team(model.url, "outcomes")


@pytest.fixture
def worker(tmp_path: Path, workers: list[WorkerProcess], team: None) -> WorkerProcess:
    return start_worker(workers, tmp_path, "outcomes", **AGENT)


@pytest.fixture
def operator(api_client_for: Callable[[str], APIClient]) -> APIClient:
    return api_client_for("operator")


def trigger(client: APIClient, key: str, **inputs: Any) -> Any:
    return client.post(f"/api/v1/patterns/{key}/trigger", {"inputs": inputs}, format="json")


def started(client: APIClient, key: str, **inputs: Any) -> str:
    response = trigger(client, key, **inputs)
    assert response.status_code == 201, response.content
    return str(response.json()["id"])


def status_of(run_id: str) -> str:
    return str(LoopRun.objects.get(pk=run_id).status)


def wait_status(run_ids: list[str], wanted: tuple[str, ...], workers: list[Any]) -> None:
    def statuses() -> list[str]:
        return [status_of(run_id) for run_id in run_ids]

    try:
        wait_for(lambda: all(s in wanted for s in statuses()), timeout=WAIT, interval=0.3)
    except TimeoutError:
        logs = "\n".join(w.log()[-3000:] for w in workers)
        raise TimeoutError(f"{statuses()}, not {wanted}\n{history(run_ids)}\n{logs}") from None


def history(run_ids: list[str]) -> str:
    """Each run's events, for a failure message."""
    return "\n".join(
        f"{run_id}: "
        + ", ".join(
            f"{e.type}{e.data if e.type.startswith(('run.', 'workspace')) else ''}"
            for e in LoopEvent.objects.filter(run_id=run_id).order_by("seq")
        )
        + "\n  steps: "
        + ", ".join(
            f"{s.seq}:{s.kind}:{s.name}:{s.status}"
            for s in LoopStep.objects.filter(run_id=run_id).order_by("seq")
        )
        for run_id in run_ids
    )


def reasons_of(client: APIClient, run_id: str) -> tuple[str, str, str]:
    """(status, terminal_reason, failure_reason) as the API shows the run."""
    body = client.get(f"/api/v1/runs/{run_id}").json()
    return body["status"], body["terminal_reason"], body["failure_reason"]


def l2_pattern(key: str, repo: Path, acting_on: str) -> Any:
    """An L2 pattern on ``repo``; each pattern acts on its own path, so that runs of different
    patterns never wait for each other's path lock (a run awaiting acceptance keeps it)."""
    return approval_pattern(
        key,
        autonomy_level="L2",
        repository_key="outcomes-repo",
        repository_root=str(repo),
        base_ref="main",
        acting_on=[acting_on],
        policy={"harness": {"isolation": {"requireWorktree": True}}},
    )


# --- the verifier's verdicts --------------------------------------------------------------


def test_verdicts_at_l1_end_the_run_as_the_verifier_says(
    worker: WorkerProcess, operator: APIClient
) -> None:
    approval_pattern("outcomes-l1")
    passed = started(operator, "outcomes-l1", verdict=verdict("pass", "all good"))
    rejected = started(
        operator,
        "outcomes-l1",
        verdict=verdict("reject", "the greeting is unchanged", "tests are missing"),
    )
    escalated = started(
        operator, "outcomes-l1", verdict=verdict("escalate", "needs a product decision")
    )
    wait_status([passed, rejected, escalated], STOPPED, [worker])

    assert reasons_of(operator, passed) == ("succeeded", "verified", "")
    assert reasons_of(operator, rejected) == (
        "failed",
        "rejected_by_verifier",
        "the greeting is unchanged; tests are missing",
    )
    status, code, why = reasons_of(operator, escalated)
    assert (status, code) == ("waiting_human", "escalated_by_verifier")
    assert "needs a product decision" in why
    for run_id, effective in ((passed, "pass"), (rejected, "reject"), (escalated, "escalate")):
        event = LoopEvent.objects.get(run_id=run_id, type="verification.verdict")
        assert event.data["effective"] == effective
        # Every role ran once, through the model server: leader, maker, verifier.
        assert LoopStep.objects.filter(run_id=run_id, kind="model").count() == 3


def test_an_l2_run_in_a_worktree_diffs_its_approved_write_and_waits_for_acceptance(
    worker: WorkerProcess,
    operator: APIClient,
    api_client_for: Callable[[str], APIClient],
    tmp_path: Path,
) -> None:
    repo = ensure_demo_repository(tmp_path / "repo")
    l2_pattern("outcomes-l2", repo, "hello.txt")
    l2_pattern("outcomes-l2-reject", repo, "reject.txt")
    l2_pattern("outcomes-l2-escalate", repo, "escalate.txt")
    passed = started(
        operator,
        "outcomes-l2",
        rounds=[[list(write_call("hello.txt", GREETING))]],
        verdict=verdict("pass", "the greeting is better"),
    )
    rejected = started(
        operator, "outcomes-l2-reject", verdict=verdict("reject", "nothing was done")
    )
    escalated = started(operator, "outcomes-l2-escalate", verdict=verdict("escalate", "unsure"))
    wait_status([passed], (RunStatus.WAITING_APPROVAL,), [worker])

    approver = api_client_for("approver")
    [pending] = approver.get(f"/api/v1/approvals?status=pending&run={passed}").json()["results"]
    assert (pending["tool_name"], pending["role"]) == ("write", "maker")
    decided = approver.post(
        f"/api/v1/approvals/{pending['id']}/decide", {"decision": "approve"}, format="json"
    )
    assert decided.status_code == 200, decided.content
    wait_status([passed, rejected, escalated], STOPPED, [worker])

    status, code, why = reasons_of(operator, passed)
    assert (status, code) == ("waiting_human", "awaiting_acceptance")
    assert "L2 needs a human to accept it" in why
    worktree = workspace_path(LoopRun.objects.get(pk=passed).id)
    assert (worktree / ".git").is_file()  # a git worktree of the repository, not a copy
    assert (worktree / "hello.txt").read_text() == GREETING
    assert (repo / "hello.txt").read_text() == "Hello, world.\n"  # the repository is untouched
    artifacts = operator.get(f"/api/v1/runs/{passed}/artifacts")
    assert artifacts.status_code == 200
    [diff] = [a for a in artifacts.json() if a["kind"] == "diff"]
    assert diff["name"] == "changes.diff" and diff["metadata"] == {"baseRef": "main"}
    assert "-Hello, world." in diff["content"]
    assert "+Hello, end-to-end world." in diff["content"]
    approval = ActionApproval.objects.get(pk=pending["id"])
    assert approval.executed_hash == approval.approved_hash != ""

    accepted = operator.post(f"/api/v1/runs/{passed}/accept", {}, format="json")
    assert accepted.status_code == 200, accepted.content
    assert reasons_of(operator, passed) == ("succeeded", "accepted", "")
    assert operator.post(f"/api/v1/runs/{passed}/accept", {}, format="json").status_code == 409

    assert reasons_of(operator, rejected) == ("failed", "rejected_by_verifier", "nothing was done")
    assert reasons_of(operator, escalated)[:2] == ("waiting_human", "escalated_by_verifier")
    # Nothing changed in these two worktrees: no diff, so no artifact.
    for run_id in (rejected, escalated):
        assert operator.get(f"/api/v1/runs/{run_id}/artifacts").json() == []
    assert audit_problems() == []


# --- approval timeout ---------------------------------------------------------------------


def test_an_expired_approval_times_out_to_the_model_or_escalates_as_the_policy_says(
    worker: WorkerProcess,
    model: ModelServer,
    procs: list[Any],
    tmp_path: Path,
    operator: APIClient,
) -> None:
    for key, then in (
        ("outcomes-expire-reject", "reject"),
        ("outcomes-expire-escalate", "escalate"),
    ):
        approval_pattern(key, policy={"approvals": {"timeoutSeconds": 1, "onTimeout": then}})
    rounds = [[list(write_call("late.txt", "too late"))]]
    goes_on = started(operator, "outcomes-expire-reject", rounds=rounds, label="goes-on")
    escalates = started(operator, "outcomes-expire-escalate", rounds=rounds, label="escalates")
    beat = start_beat(procs, tmp_path, interval=1.0)  # the reaper expires the approvals
    wait_status([goes_on, escalates], STOPPED, [worker, beat])

    assert reasons_of(operator, goes_on) == ("succeeded", "verified", "")
    [expired] = ActionApproval.objects.filter(run_id=goes_on)
    assert (expired.status, expired.decided_by, expired.executed_hash) == ("expired", "timeout", "")
    step = LoopStep.objects.get(run_id=goes_on, seq=expired.step_seq)
    told = str(step.response.get("content", ""))
    assert "timed out" in told and "approver" not in told.lower(), told
    assert not (workspace_path(LoopRun.objects.get(pk=goes_on).id) / "late.txt").exists()
    # What the model was given after the resume: the call timed out, nobody denied it.
    maker_results = [
        result
        for messages in (body["messages"] for body in model.bodies)
        if role_of(messages) == "maker" and inputs_of(messages).get("label") == "goes-on"
        for result in tool_results(messages)
    ]
    assert maker_results and all("timed out" in r for r in maker_results), maker_results
    assert not any("reject" in r.lower() or "denied" in r.lower() for r in maker_results)
    events = list(LoopEvent.objects.filter(run_id=goes_on).values_list("type", flat=True))
    assert "approval.expired" in events and events.count("approval.resumed") <= 1

    status, code, why = reasons_of(operator, escalates)
    assert (status, code) == ("waiting_human", "approval_timeout")
    assert "'write'" in why and "escalates expired approvals" in why
    [escalated] = ActionApproval.objects.filter(run_id=escalates)
    assert (escalated.status, escalated.executed_hash) == ("expired", "")
    assert not (workspace_path(LoopRun.objects.get(pk=escalates).id) / "late.txt").exists()
    assert audit_problems() == []


# --- the pattern circuit breaker ----------------------------------------------------------


def test_the_breaker_trips_on_failed_runs_then_a_probe_closes_it(
    worker: WorkerProcess, operator: APIClient
) -> None:
    key = "outcomes-breaker"
    approval_pattern(key, policy={"circuitBreaker": {"failureThreshold": 2, "cooldownSeconds": 1}})
    failing = [started(operator, key, verdict=verdict("reject", "broken")) for _ in range(2)]
    wait_status(failing, (RunStatus.FAILED,), [worker])

    refused = trigger(operator, key, verdict=verdict("pass"))
    assert refused.status_code == 409, refused.content
    body = refused.json()
    assert "circuit breaker open after 2 consecutive failed runs; retry after" in body["detail"]
    assert (body["breaker_state"], body["consecutive_failures"]) == ("open", 2)
    open_until = datetime.fromisoformat(body["breaker_open_until"].replace("Z", "+00:00"))
    wait_for(lambda: timezone.now() > open_until, timeout=30, interval=0.1)
    time.sleep(0.2)

    # After the cooldown one trigger is the probe; its leader takes a while, so the breaker
    # is certainly still half-open when the next trigger comes.
    probe = started(operator, key, verdict=verdict("pass"), slow=2)
    assert LoopEvent.objects.filter(run_id=probe, type="breaker.probe").exists()
    assert CircuitState.objects.get(key=f"pattern:{key}").state == "half_open"
    during = trigger(operator, key, verdict=verdict("pass"))
    assert during.status_code == 409, during.content
    assert "half-open" in during.json()["detail"] and probe in during.json()["detail"]

    wait_status([probe], (RunStatus.SUCCEEDED,), [worker])
    breaker = CircuitState.objects.get(key=f"pattern:{key}")
    assert (breaker.state, breaker.consecutive_failures) == ("closed", 0)
    finished = LoopEvent.objects.filter(run_id=probe, type="verification.verdict").get()
    assert finished.data["breaker"]["state"] == "closed"
    after = started(operator, key, verdict=verdict("pass"))
    wait_status([after], (RunStatus.SUCCEEDED,), [worker])
    assert LoopRun.objects.filter(pattern__key=key).count() == 4
