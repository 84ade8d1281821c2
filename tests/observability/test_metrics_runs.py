"""``/metrics`` while runs run: a real ``celery worker`` drives the production AgentInvoker
against the loopback model server, and the web application's ``/metrics`` (this process) and the
worker's own metrics port both show its counters move; what this process does (a cancel over
the API, a parked approval, the reaper) moves them too. Every scrape is parsed with
``prometheus_client``'s text parser."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from loops.models import LoopRun, LoopStep, RunStatus
from loops.services.claims import run_claim, runs_reap
from orchestrator.metrics_store import metrics_dir
from tests.e2e.conftest import start_worker
from tests.observability.scrape import moved, names, port_scrape, value, web_scrape
from tests.support.approvals import (
    approval_pattern,
    http_reply,
    loopback_team,
    park_directly,
    write_call,
)
from tests.support.factories import make_run
from tests.support.model_server import ModelServer
from tests.support.workers import WorkerProcess, wait_for

ENDPOINT = "metrics-loopback"


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer() as server:
        server.always(http_reply)
        yield server
    server.check()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.e2e
@pytest.mark.timeout(600)
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("seeded_profiles")
def test_a_run_on_a_worker_moves_the_counters_of_the_web_metrics_and_of_the_worker_port(
    model: ModelServer,
    workers: list[WorkerProcess],
    tmp_path: Path,
    api_client_for: Callable[[str], APIClient],
) -> None:
    loopback_team(model.url, "metrics")
    approval_pattern("metrics-run")
    port = _free_port()
    worker = start_worker(
        workers,
        tmp_path,
        "metrics",
        LOOPWRIGHT_INVOKER="loops.worker.invoker.AgentInvoker",
        LOOPWRIGHT_METRICS_WORKER_PORT=str(port),
    )
    before = web_scrape()
    response = api_client_for("operator").post(
        "/api/v1/patterns/metrics-run/trigger",
        {"inputs": {"rounds": [[["list", {"path": "."}]]]}},
        format="json",
    )
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]
    wait_for(
        lambda: LoopRun.objects.get(pk=run_id).status == RunStatus.SUCCEEDED,
        timeout=180,
        message=worker.log()[-3000:],
    )
    after = web_scrape()

    # Counted in the worker process, summed by the web process from the shared folder.
    ended = {"status": "succeeded", "reason": "verified"}
    assert moved(before, after, "loopwright_runs_ended_total", **ended) == 1
    # leader, maker (a tool call, then its answer), verifier: one call per model step
    model_steps = LoopStep.objects.filter(run_id=run_id, kind="model").count()
    assert model_steps == 4
    calls = {"endpoint": ENDPOINT, "outcome": "ok"}
    call_count = "loopwright_model_call_duration_seconds_count"
    assert moved(before, after, call_count, **calls) == model_steps
    assert moved(before, after, "loopwright_model_call_duration_seconds_sum", **calls) > 0
    steps = {"kind": "model", "endpoint": ENDPOINT}
    assert moved(before, after, "loopwright_step_duration_seconds_count", **steps) == model_steps
    assert moved(before, after, "loopwright_tool_calls_total", tier="read", outcome="ok") == 1
    assert moved(before, after, "loopwright_tool_call_duration_seconds_count", tier="read") == 1
    # Read from the database at the scrape.
    assert value(after, "loopwright_model_breaker_state", endpoint=ENDPOINT, state="closed") == 1
    assert value(after, "loopwright_model_breaker_state", endpoint=ENDPOINT, state="open") == 0
    assert value(after, "loopwright_runs", status="running") == 0
    assert (metrics_dir() / f"counter_{worker.pid}.db").exists()
    assert not [labels for _, labels in after if str(run_id) in dict(labels).values()]

    # The worker's own port: the same counters, without the database's state.
    own = port_scrape(port)
    assert value(own, "loopwright_runs_ended_total", **ended) == value(
        after, "loopwright_runs_ended_total", **ended
    )
    assert value(own, call_count, **calls) >= model_steps
    assert "loopwright_runs" not in names(own)
    assert "loopwright_model_breaker_state" not in names(own)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("seeded_profiles")
def test_a_cancel_a_parked_approval_and_the_reaper_move_the_web_processes_metrics(
    api_client_for: Callable[[str], APIClient],
) -> None:
    loopback_team("http://127.0.0.1:9/v1", "metrics-web")
    before = web_scrape()
    queued = make_run()
    assert value(web_scrape(), "loopwright_runs", status="queued") == 1
    assert value(web_scrape(), "loopwright_run_queue_depth") == 1

    answer = api_client_for("operator").post(f"/api/v1/runs/{queued.id}/cancel", {}, format="json")
    assert answer.status_code == 200, answer.content
    cancelled = web_scrape()
    reason = LoopRun.objects.get(pk=queued.id).terminal_reason  # as the row records it
    ended = {"status": "canceled", "reason": reason}
    assert reason and moved(before, cancelled, "loopwright_runs_ended_total", **ended) == 1
    assert value(cancelled, "loopwright_runs", status="queued") == 0

    parked = park_directly(approval_pattern("metrics-parked"), [write_call("notes.txt", "hi")])
    waiting = web_scrape()
    assert value(waiting, "loopwright_approvals_pending") == 1
    assert value(waiting, "loopwright_approval_oldest_pending_age_seconds") > 0
    assert value(waiting, "loopwright_runs", status="waiting_approval") == 1

    stale = make_run()
    [claim] = run_claim(owner="gone-worker", lease_seconds=300, run_id=stale.id)
    expired = timezone.now() - timedelta(seconds=5)
    LoopRun.objects.filter(pk=claim.lease.run_id).update(lease_expires_at=expired)
    report = runs_reap()
    assert report.requeued == [stale.id]
    reaped = web_scrape()
    assert moved(waiting, reaped, "loopwright_runs_reaped_total", outcome="requeued") == 1
    assert parked.id != stale.id
