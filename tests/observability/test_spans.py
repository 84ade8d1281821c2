"""A run's spans from a real engine run (in this process, ``tests.support.approvals.Engine``):
the tree the API answers, the harness ``observability`` section binding it, the record the
sweep stores when the run ends, and the pruning after ``tracingRetentionDays``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from harness.services import profile_create
from loops.models import LoopPattern, LoopRun, LoopSpan, LoopSpanRecord, LoopStep, RunStatus
from loops.services.spans import run_spans, spans_prune, spans_record, spans_sweep
from loops.spans import span_dict
from tests.support.approvals import Engine, approval_pattern, park_inline, pending_approvals

pytestmark = pytest.mark.django_db
READ = ("read", {"path": "README.md"})
WRITE = ("write", {"path": "notes.txt", "content": "hello"})


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    return Engine(tmp_path / "ledger")


@pytest.fixture
def approver(api_client_for: Callable[[str], APIClient]) -> APIClient:
    return api_client_for("approver")


def pattern_with(observability: dict[str, Any] | None, key: str = "spans") -> LoopPattern:
    """The approvals team; the maker's profile adds ``observability`` to ``default``'s."""
    if observability is None:
        return approval_pattern(key)
    tag = f"obs-{key}"
    profile_create(tag=tag, settings={"observability": observability})
    return approval_pattern(key, maker_harness_tag=tag)


def finished_run(engine: Engine, approver: APIClient, pattern: LoopPattern) -> LoopRun:
    """A run whose maker reads, then writes after a human approves the write."""
    run = park_inline(engine, pattern, [READ], [WRITE])
    [approval] = pending_approvals(run)
    decided = approver.post(
        f"/api/v1/approvals/{approval.id}/decide", {"decision": "approve"}, format="json"
    )
    assert decided.status_code == 200, decided.content
    assert engine.drive(run.id) == RunStatus.SUCCEEDED
    return LoopRun.objects.get(pk=run.id)


def walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node["children"] for n in walk(child))]


def test_the_api_answers_the_runs_tree_with_calls_tiers_and_the_approval_wait(
    engine: Engine, approver: APIClient, viewer_client: APIClient
) -> None:
    run = finished_run(engine, approver, pattern_with(None))
    response = viewer_client.get(f"/api/v1/runs/{run.id}/spans")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["run"], body["trace_id"], body["origin"]) == (str(run.id), run.trace_id, "journal")
    [root] = body["spans"]
    assert root["kind"] == "run" and root["status"] == "ok"
    assert [c["name"] for c in root["children"]] == ["leader", "maker:0", "verifier"]
    maker = root["children"][1]
    assert maker["status"] == "ok"  # the model went on from its failed read
    kinds = [(c["kind"], c["name"], c["tier"], c["status"]) for c in maker["children"]]
    assert kinds == [
        ("model", "approvals-script", "", "ok"),
        ("tool", "read", "read", "error"),  # README.md does not exist in the workspace
        ("model", "approvals-script", "", "ok"),
        ("tool", "write", "write", "ok"),
        ("model", "approvals-script", "", "ok"),
    ]
    [wait] = maker["children"][3]["children"]
    assert (wait["kind"], wait["status"], wait["attributes"]["decided_by"]) == (
        "approval",
        "ok",
        "approver",
    )
    steps = LoopStep.objects.filter(run=run).exclude(kind="notice")
    by_seq = {
        s["step_seq"]: s for s in walk(root) if s["kind"] not in ("run", "invocation", "approval")
    }
    for row in steps:
        span = by_seq[row.seq]
        assert span["tokens_in"] == row.tokens_in and span["status"] in ("ok", "error")
        assert span["attributes"]["input"] == row.request
    assert root["tokens_in"] == sum(s.tokens_in for s in steps if s.kind == "model")


def test_stored_spans_are_the_journals_and_are_stored_once(
    engine: Engine, approver: APIClient
) -> None:
    run = finished_run(engine, approver, pattern_with(None))
    live = run_spans(run).spans
    report = spans_sweep()
    assert (report.recorded, report.spans) == (1, len(live))
    assert spans_sweep().recorded == 0 and spans_record(run_id=run.id) == 0
    stored = run_spans(run)
    assert stored.origin == "stored"
    assert sorted(map(span_dict, stored.spans), key=str) == sorted(map(span_dict, live), key=str)
    assert LoopSpanRecord.objects.get(run=run).spans == len(live)


def test_a_run_still_going_is_not_stored(engine: Engine) -> None:
    run = park_inline(engine, pattern_with(None), [WRITE])
    assert spans_sweep().recorded == 0 and spans_record(run_id=run.id) == 0
    spans = run_spans(run).spans
    wait = next(s for s in spans if s.kind == "approval")
    assert (wait.status, wait.ended_at) == ("running", None)


def test_captured_inputs_and_outputs_follow_the_roles_harness(
    engine: Engine, approver: APIClient
) -> None:
    quiet = {"captureInputs": False, "captureOutputs": False}
    run = finished_run(engine, approver, pattern_with(quiet, "quiet"))
    spans_record(run_id=run.id)
    attributes = {(row.role, row.kind): row.attributes for row in LoopSpan.objects.filter(run=run)}
    assert attributes[("maker", "tool")] == {} and attributes[("maker", "model")] == {}
    assert set(attributes[("leader", "model")]) == {"input", "output"}


def test_a_role_whose_harness_disables_spans_records_none(
    engine: Engine, approver: APIClient
) -> None:
    run = finished_run(engine, approver, pattern_with({"enabled": False}, "dark"))
    spans = run_spans(run).spans
    assert {s.role for s in spans} == {"", "leader", "verifier"}
    assert spans_record(run_id=run.id) == len(spans)


def test_a_role_sampled_out_records_no_spans(engine: Engine, approver: APIClient) -> None:
    run = finished_run(engine, approver, pattern_with({"samplingRate": 0.0}, "unsampled"))
    spans = run_spans(run).spans
    assert {s.role for s in spans} == {"", "leader", "verifier"}
    assert spans_record(run_id=run.id) == len(spans)
    assert not LoopSpan.objects.filter(run=run, role="maker").exists()


def test_spans_past_their_roles_retention_are_pruned(engine: Engine, approver: APIClient) -> None:
    run = finished_run(engine, approver, pattern_with({"tracingRetentionDays": 2}, "brief"))
    spans_record(run_id=run.id)
    assert run.finished_at is not None
    assert spans_prune(now=run.finished_at + timedelta(days=1)) == 0
    makers = LoopSpan.objects.filter(run=run, role="maker").count()
    assert makers > 0
    assert spans_prune(now=run.finished_at + timedelta(days=3)) == makers
    assert not LoopSpan.objects.filter(run=run, role="maker").exists()
    # The platform keeps the other roles 30 days; then the run's record says so.
    assert spans_prune(now=run.finished_at + timedelta(days=31)) > 0
    assert run_spans(run).origin == "pruned" and run_spans(run).spans == []


def test_a_traceparent_sent_to_the_trigger_api_is_the_runs_trace_id(
    operator_client: APIClient,
) -> None:
    pattern = pattern_with(None, "traced")
    trace = "0af7651916cd43dd8448eb211c80319c"
    response = operator_client.post(
        f"/api/v1/patterns/{pattern.key}/trigger",
        {"inputs": {}},
        format="json",
        HTTP_TRACEPARENT=f"00-{trace}-b7ad6b7169203331-01",
    )
    assert response.status_code == 201, response.content
    run = LoopRun.objects.get(pk=response.json()["id"])
    assert run.trace_id == trace
    spans = operator_client.get(f"/api/v1/runs/{run.id}/spans").json()
    assert spans["trace_id"] == trace
    untraced = operator_client.post(
        f"/api/v1/patterns/{pattern.key}/trigger", {"inputs": {}}, format="json"
    )
    other = LoopRun.objects.get(pk=untraced.json()["id"]).trace_id
    assert other != trace and len(other) == 32 and int(other, 16)
