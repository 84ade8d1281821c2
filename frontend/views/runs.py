"""The monitor (runs table) and a run's page, with the human actions on a run."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone

from frontend.access import actor_of, can, ui_view
from frontend.forms import ActionForm
from frontend.selectors import monitor as monitor_query
from frontend.selectors import patterns, runs
from frontend.selectors.budgets import run_budget_sections
from frontend.selectors.retrievals import run_retrievals
from frontend.selectors.waterfall import run_waterfall
from frontend.templatetags.ui import short_id
from frontend.views.approvals import run_approvals
from loops import state
from loops.models import LoopRun, RunStatus
from loops.services.runs import run_act, run_harness_notices, run_retry
from orchestrator.accounts.roles import Role
from orchestrator.errors import DomainError

MONITOR_PAGE_SIZE = 50
ACTION_LABELS = {
    "pause": "Pause",
    "resume": "Resume",
    "escalate": "Escalate to a human",
    "accept": "Accept result",
    "retry": "Retry as a new run",
    "cancel": "Cancel run",
}
DONE_MESSAGES = {
    "pause": "Run paused.",
    "resume": "Run resumed: it is queued again.",
    "cancel": "Run canceled.",
    "escalate": "Run escalated: it waits for a human.",
    "accept": "Result accepted: the run succeeded.",
}


def monitor_context(request: HttpRequest) -> dict[str, Any]:
    filters = monitor_query.RunFilters.from_query(request.GET)
    cursor = runs.change_cursor_now()  # before the runs: what changes later is streamed
    page = monitor_query.runs_page(filters, MONITOR_PAGE_SIZE)
    stream_query = urlencode({**filters.query(), "since": cursor.encode()})
    base = filters.query()
    return {
        "filters": filters,
        "runs": page.runs,
        "next_url": "?" + urlencode({**base, "after": page.next_cursor})
        if page.next_cursor
        else "",
        "previous_url": (
            "?" + urlencode({**base, "before": page.previous_cursor})
            if page.previous_cursor
            else ""
        ),
        "first_url": "?" + urlencode(base) if not page.first else "",
        "counts": runs.run_counts(),
        "pattern_keys": patterns.pattern_keys(),
        "statuses": RunStatus.choices,
        "triggers": runs.TRIGGER_CHOICES,
        "sorts": monitor_query.SORTS,
        "sort_label": monitor_query.SORTS[filters.sort],
        "periods": {key: label for key, (label, _) in monitor_query.PERIODS.items()},
        "stream_url": reverse("ui:stream-runs") + "?" + stream_query,
        # New runs are inserted at the top only where they belong: newest first, first page.
        "live_insert": page.first and filters.sort == "newest",
        "page_size": MONITOR_PAGE_SIZE,
    }


@ui_view()
def monitor(request: HttpRequest) -> HttpResponse:
    """Runs, newest first, filtered by GET parameters; new runs arrive live (see streams)."""
    return render(request, "frontend/runs/monitor.html", monitor_context(request))


def actions_for(user: Any, run: LoopRun) -> list[dict[str, str]]:
    """The buttons this user may press on this run now (none for non-operators)."""
    if not can(user, Role.OPERATOR):
        return []
    names = sorted(state.allowed_actions(run.status), key=lambda name: name == "cancel")
    return [{"name": name, "label": ACTION_LABELS[name]} for name in names]


def run_header_context(request: HttpRequest, run: LoopRun) -> dict[str, Any]:
    """What the live-updated parts of a run page need (summary, actions, verdict)."""
    usage = runs.run_usage(run.id)
    return {
        "run": run,
        "usage": usage,
        "time_split": runs.run_time_split(run.id, usage),
        "budgets": run_budget_sections(run),
        "retries": runs.run_retries(run.id),
        "actions": actions_for(request.user, run),
        "approvals": run_approvals(request.user, run),
        "artifacts": runs.run_artifacts(run.id),
        "is_terminal": run.status in {s.value for s in state.TERMINAL},
    }


def _snapshots(run: LoopRun) -> list[tuple[str, Any]]:
    snaps = run.harness_snapshots or {}
    out: list[tuple[str, Any]] = []
    if "leader" in snaps:
        out.append((f"Leader · {run.role_bindings.get('leader', '')}", snaps["leader"]))
    for index, (maker, snap) in enumerate((snaps.get("makers") or {}).items()):
        out.append((f"Maker {index + 1} · {maker}", snap))
    if "verifier" in snaps:
        out.append((f"Verifier · {run.role_bindings.get('verifier', '')}", snaps["verifier"]))
    return out


def plan_of(run: LoopRun) -> dict[str, Any] | None:
    """The leader's plan the run works to (``cursor.plan``: tasks with a title and maybe a
    detail, and notes), or None before the leader has planned."""
    plan = (run.cursor or {}).get("plan")
    if not isinstance(plan, dict) or not isinstance(plan.get("tasks"), list):
        return None
    tasks = [t for t in plan["tasks"] if isinstance(t, dict) and t.get("title")]
    return {"tasks": tasks, "notes": str(plan.get("notes") or "")}


@ui_view()
def run_detail(request: HttpRequest, run_id: str) -> HttpResponse:
    run = runs.run_detail(runs.parse_run_id(run_id))
    steps = runs.run_steps(run.id)
    events = runs.run_events(run.id)
    context = {
        **run_header_context(request, run),
        "groups": runs.group_steps(steps, run.role_bindings or {}),
        "events": events,
        "snapshots": _snapshots(run),
        "harness_notices": run_harness_notices(run),
        "last_event_seq": events[-1].seq if events else 0,
        "last_step_seq": steps[-1].seq if steps else 0,
        "open_steps": ",".join(str(s.seq) for s in steps if s.status in runs.OPEN_STEP_STATUSES),
        "waterfall": run_waterfall(run, timezone.now()),
        "plan": plan_of(run),
        "retrievals": run_retrievals(run.id, run.role_bindings or {}),
    }
    return render(request, "frontend/runs/detail.html", context)


@ui_view(methods=("POST",), write=Role.OPERATOR)
def run_action(request: HttpRequest, run_id: str, action: str) -> HttpResponse:
    """pause, resume, cancel (with an optional reason), escalate, accept."""
    run = runs.run_detail(runs.parse_run_id(run_id))
    form = ActionForm(request.POST)
    if not form.is_valid():
        messages.error(request, "The reason is too long (2,000 characters at most).")
        return redirect("ui:run", run_id=run.id)
    try:
        run_act(
            run_id=run.id,
            action=action,
            actor=actor_of(request),
            reason=form.cleaned_data["reason"],
        )
    except DomainError as exc:
        messages.error(request, exc.detail)
    else:
        messages.success(request, DONE_MESSAGES[action])
    return redirect("ui:run", run_id=run.id)


@ui_view(methods=("POST",), write=Role.OPERATOR)
def run_retry_view(request: HttpRequest, run_id: str) -> HttpResponse:
    """Start a new run with the same inputs and go to it."""
    run = runs.run_detail(runs.parse_run_id(run_id))
    try:
        new_run = run_retry(run_id=run.id, actor=actor_of(request))
    except DomainError as exc:
        messages.error(request, exc.detail)
        return redirect("ui:run", run_id=run.id)
    messages.success(request, f"Retry of run {short_id(run.id)} started.")
    return redirect(reverse("ui:run", kwargs={"run_id": new_run.id}))
