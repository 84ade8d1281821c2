"""Approvals: the pending queue across runs, one approval's page, and the decision on it.

Notifications link to ``/approvals/<id>``. Every role reads; deciding needs the approver role
(checked by the guard on the POST, and again by ``approval_decide``, which also accepts
nobody's decision twice). The run page shows the same decision form inline.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from frontend.access import can, ui_view
from frontend.proposed_changes import ProposedChange, proposed_change
from frontend.schema_forms import SchemaDecideForm
from frontend.selectors import approvals
from loops.models import ActionApproval, ApprovalStatus, LoopRun, RunStatus
from loops.services.approvals import approval_decide
from orchestrator.accounts.roles import Role
from orchestrator.errors import DomainError, InvalidInput

#: The query keys of a page of the queue (its cursors), kept by its links and its stream.
PAGE_KEYS = ("after", "before")
DONE = {"approved": "Approved: the run goes on.", "rejected": "Rejected: the model is told why."}


def decidable(user: Any, approval: ActionApproval) -> bool:
    """Whether to offer ``user`` the decision form now (the POST is checked again)."""
    return (
        can(user, Role.APPROVER)
        and approval.status == ApprovalStatus.PENDING
        and approval.run.status == RunStatus.WAITING_APPROVAL
    )


def change_of(approval: ActionApproval) -> ProposedChange | None:
    """What a gated file tool call would change in its run's workspace (None: not a file
    tool)."""
    workdir = (approval.run.cursor or {}).get("workdir")
    return proposed_change(approval.tool_name, approval.arguments, workdir)


def run_approvals(user: Any, run: LoopRun) -> list[dict[str, Any]]:
    """The run's approvals for its page: each with a decision form when ``user`` may decide."""
    rows = []
    for approval in approvals.run_approvals(run.id):
        approval.run = run  # the caller's copy is the current one
        form = None
        if decidable(user, approval):  # ids per approval: a run may wait on several
            form = SchemaDecideForm(approval=approval, auto_id=f"approval-{approval.id}-%s")
        change = None
        if approval.status == ApprovalStatus.PENDING:
            change = change_of(approval)
        rows.append({"approval": approval, "form": form, "change": change})
    return rows


def queue_context(request: HttpRequest) -> dict[str, Any]:
    """A page of the pending approvals of every run, oldest first (``after`` / ``before``
    cursors in the query), each write or edit with its diff, then the latest decisions."""
    page = approvals.pending_page(
        after=request.GET.get("after", ""), before=request.GET.get("before", "")
    )
    here = reverse("ui:approvals")
    return {
        "pending": [
            {
                "approval": approval,
                "change": change_of(approval),
            }
            for approval in page.approvals
        ],
        "pending_total": page.total,
        "next_url": f"{here}?{urlencode({'after': page.next_cursor})}" if page.next_cursor else "",
        "previous_url": (
            f"{here}?{urlencode({'before': page.previous_cursor})}" if page.previous_cursor else ""
        ),
        "page_query": urlencode(
            {k: request.GET[k] for k in ("after", "before") if k in request.GET}
        ),
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
    request: HttpRequest, approval: ActionApproval, form: SchemaDecideForm | None, status: int = 200
) -> HttpResponse:
    if form is None and decidable(request.user, approval):
        form = SchemaDecideForm(approval=approval)
    context = {
        "approval": approval,
        "run": approval.run,
        "change": change_of(approval) if approval.status == ApprovalStatus.PENDING else None,
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
    """Approve (as proposed or with edited arguments) or reject with a reason, with the review
    the call's review schema asks for."""
    approval = approvals.approval_of(approval_id)
    form = SchemaDecideForm(request.POST, approval=approval)
    if not form.is_valid():
        return _detail(request, approval, form, status=400)
    if (
        request.POST.get("from") == "queue"
        and form.cleaned_data["decision"] == "reject"
        and not (form.cleaned_data["reason"])
    ):
        messages.error(request, "Give a reason to reject: it is what the model is told.")
        return redirect(_next_url(request, approval))
    try:
        decided = approval_decide(
            approval_id=approval.id,
            user=request.user,
            decision=form.cleaned_data["decision"],
            input=form.cleaned_data["edited"],
            reason=form.cleaned_data["reason"],
            answer=form.cleaned_data["answer"] or None,
            review=form.cleaned_data["review"],
        )
    except InvalidInput as exc:
        form.add_service_errors(exc.extra.get("errors") or [])
        if not form.errors:
            form.add_error("input" if "input" in form.fields else None, exc.detail)
        return _detail(request, approvals.approval_of(approval_id), form, status=400)
    except DomainError as exc:  # decided meanwhile, the run moved on, the policy denies it
        messages.error(request, exc.detail)
        return redirect("ui:approval", approval_id=approval.id)
    messages.success(request, DONE.get(decided.status, "Decision recorded."))
    return redirect(_next_url(request, approval))
