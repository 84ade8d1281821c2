"""Approvals: the pending queue across runs, one approval's page, and the decision on it.

Notifications link to ``/approvals/<id>``. Every role reads; deciding needs the approver role
(checked by the guard on the POST, and again by ``approval_decide``, which also accepts
nobody's decision twice). The run page shows the same decision form inline.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from frontend.access import can, ui_view
from frontend.forms import DecideForm, add_service_errors
from frontend.selectors import approvals
from loops.models import ActionApproval, ApprovalStatus, LoopRun, RunStatus
from loops.services.approvals import approval_decide
from orchestrator.accounts.roles import Role
from orchestrator.errors import DomainError, InvalidInput

DONE = {"approved": "Approved: the run goes on.", "rejected": "Rejected: the model is told why."}


def decidable(user: Any, approval: ActionApproval) -> bool:
    """Whether to offer ``user`` the decision form now (the POST is checked again)."""
    return (
        can(user, Role.APPROVER)
        and approval.status == ApprovalStatus.PENDING
        and approval.run.status == RunStatus.WAITING_APPROVAL
    )


def run_approvals(user: Any, run: LoopRun) -> list[dict[str, Any]]:
    """The run's approvals for its page: each with a decision form when ``user`` may decide."""
    rows = []
    for approval in approvals.run_approvals(run.id):
        approval.run = run  # the caller's copy is the current one
        form = None
        if decidable(user, approval):  # ids per approval: a run may wait on several
            form = DecideForm(proposed=approval.arguments, auto_id=f"approval-{approval.id}-%s")
        rows.append({"approval": approval, "form": form})
    return rows


def queue_context(request: HttpRequest) -> dict[str, Any]:
    """The pending approvals of every run, oldest first, then the latest decisions."""
    return {
        "pending": approvals.pending_approvals(),
        "decided": approvals.recent_decisions(),
        "can_decide": can(request.user, Role.APPROVER),
    }


@ui_view()
def approval_list(request: HttpRequest) -> HttpResponse:
    """The queue page; it follows new and decided approvals live (``frontend.streams``)."""
    version = approvals.queue_version()  # before the rows: what changes later is streamed
    context = {**queue_context(request), "version": version}
    return render(request, "frontend/approvals/list.html", context)


def _detail(
    request: HttpRequest, approval: ActionApproval, form: DecideForm | None, status: int = 200
) -> HttpResponse:
    if form is None and decidable(request.user, approval):
        form = DecideForm(proposed=approval.arguments)
    context = {
        "approval": approval,
        "run": approval.run,
        "form": form,
        "can_decide": can(request.user, Role.APPROVER),
    }
    return render(request, "frontend/approvals/detail.html", context, status=status)


@ui_view()
def approval_detail(request: HttpRequest, approval_id: str) -> HttpResponse:
    return _detail(request, approvals.approval_of(approval_id), None)


def _next_url(request: HttpRequest, approval: ActionApproval) -> str:
    wanted = request.POST.get("next", "")
    if wanted and url_has_allowed_host_and_scheme(
        wanted, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return wanted
    return reverse("ui:approval", kwargs={"approval_id": approval.id})


@ui_view(methods=("POST",), write=Role.APPROVER)
def approval_decide_view(request: HttpRequest, approval_id: str) -> HttpResponse:
    """Approve (as proposed or with edited arguments) or reject with a reason."""
    approval = approvals.approval_of(approval_id)
    form = DecideForm(request.POST, proposed=approval.arguments)
    if not form.is_valid():
        return _detail(request, approval, form, status=400)
    try:
        decided = approval_decide(
            approval_id=approval.id,
            user=request.user,
            decision=form.cleaned_data["decision"],
            input=form.cleaned_data["edited"],
            reason=form.cleaned_data["reason"],
            answer=form.cleaned_data["answer"] or None,
        )
    except InvalidInput as exc:
        add_service_errors(form, exc.extra.get("errors") or [], fallback="input")
        if not form.errors:
            form.add_error("input", exc.detail)
        return _detail(request, approvals.approval_of(approval_id), form, status=400)
    except DomainError as exc:  # decided meanwhile, the run moved on, the policy denies it
        messages.error(request, exc.detail)
        return redirect("ui:approval", approval_id=approval.id)
    messages.success(request, DONE.get(decided.status, "Decision recorded."))
    return redirect(_next_url(request, approval))
