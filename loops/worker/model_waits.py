"""A run's model wait: the engine's park when every model endpoint failed (one
``run.retry_later`` when the wait starts, then only the wait record), the failure once the wait
has lasted the role's ``limits.modelRetryWindowMs``, and the journal whose first model step ends
the wait (docs/runs.md "Model waits")."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from loops.models import LoopRun, RunStatus
from loops.services.endings import run_transition
from loops.services.harness_limits import (
    MODEL_UNAVAILABLE,
    HarnessLimits,
    model_retry_delay,
    model_retry_window,
    model_unavailable_reason,
)
from loops.services.transitions import Lease, run_wait, run_wait_end
from loops.services.waits import wait_elapsed_seconds, wait_poll
from loops.worker.journal import DbJournal, DbThreads
from orchestrator.sql import time_in
from runtime.invocation import LoopRole, RetryLater
from runtime.model_failures import ModelTemporarilyUnavailable

#: What ends a model wait while the run goes on (``wait.ended``'s ``ended_by``).
MODEL_ANSWERED = "model.answered"


@transaction.atomic
def park_for_retry(lease: Lease, exc: RetryLater, snapshot: dict[str, Any]) -> str:
    """Park the run in its model wait until its next try (one ``run.retry_later`` when the wait
    starts, then only the wait record), or fail it ``model_unavailable`` once the wait has
    lasted the role's ``limits.modelRetryWindowMs``. Returns the run's status afterwards."""
    now = timezone.now()
    stored = LoopRun.objects.select_for_update().filter(pk=lease.run_id)
    current: dict[str, Any] = dict(stored.values_list("wait", flat=True).first() or {})
    model = current if current.get("kind") == "model" else {}
    detail = _model_wait_detail(exc, model.get("detail") or {})
    poll = wait_poll(model, "model", now, detail)
    waited = wait_elapsed_seconds(poll.record, now)
    window = model_retry_window(snapshot)
    delay = model_retry_delay(window, waited, exc.delay_seconds)
    if delay is None:
        reason = model_unavailable_reason(window, detail, waited, int(poll.record["polls"]))
        data = {
            "code": MODEL_UNAVAILABLE,
            "reason": reason,
            **window.data(),
            "endpoint": detail["endpoint"],
            "error": detail["error"] or detail.get("refused", ""),
            "waited_seconds": round(waited, 3),
            "tries": poll.record["polls"],
        }
        run_transition(
            run_id=lease.run_id,
            to=RunStatus.FAILED,
            actor=lease.owner,
            lease=lease,
            event_type="run.failed",
            data=data,
            fields={"terminal_reason": MODEL_UNAVAILABLE, "failure_reason": reason},
        )
        return RunStatus.FAILED.value
    detail["next_attempt"] = (now + timedelta(seconds=delay)).isoformat()
    run_wait(
        lease=lease,
        to=RunStatus.QUEUED,
        kind="model",
        event_type="run.retry_later",
        detail=detail,
        data={"kind": "model", "reason": str(exc), "delay_seconds": round(delay, 3)},
        fields={"not_before": time_in(delay)},
    )
    return RunStatus.QUEUED.value


def _model_wait_detail(exc: RetryLater, previous: dict[str, Any]) -> dict[str, Any]:
    """What the run waits on: the endpoint, ``error`` (the last error the endpoint itself gave;
    empty while none was seen) and, when the latest try was only refused by the endpoint's open
    circuit, ``refused`` (when the circuit lets a probe through): a refusal says nothing new
    about the endpoint, so it never replaces its error."""
    failed = exc.detail if isinstance(exc, ModelTemporarilyUnavailable) else {"error": str(exc)}
    detail: dict[str, Any] = {
        "endpoint": str(failed.get("endpoint") or previous.get("endpoint") or ""),
        "error": str(failed.get("error") or ""),
        "failures": list(failed.get("failures") or []),
    }
    if failed.get("circuit"):
        detail["refused"] = detail["error"]
        detail["error"] = str(previous.get("error") or "")
    if "overflow" in failed:
        detail["overflow"] = {k: v for k, v in failed.items() if k not in detail and k != "circuit"}
    return detail


class ModelWaitJournal(DbJournal):
    """The journal of an invocation that starts in a model wait: the first model step it
    records (the model answered) ends the wait (``wait.ended``, ``run_wait_end``), once."""

    def __init__(self, *args: Any, wait: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wait = wait

    async def record(self, *, kind: str, **fields: Any) -> int:
        seq = await super().record(kind=kind, **fields)
        if kind == "model" and self.wait:
            await self.driver.db(run_wait_end, lease=self.lease, ended_by=MODEL_ANSWERED)
            self.wait.clear()  # the run's state: the next invocation of this drive is plain
        return seq


def model_wait_journal(
    driver: DbThreads,
    lease: Lease,
    role: LoopRole,
    name: str,
    *,
    harness: HarnessLimits,
    wait: dict[str, Any],
) -> DbJournal:
    """The invocation's journal: a :class:`ModelWaitJournal` when the run is in a model wait
    (``wait`` is the run state's record, cleared in place when the wait ends)."""
    if wait.get("kind") == "model":
        return ModelWaitJournal(driver, lease, role, name, harness=harness, wait=wait)
    return DbJournal(driver, lease, role, name, harness=harness)
