"""Announce new pending approvals: an outgoing webhook (JSON with a deep link and a
Slack-compatible ``text``) and e-mail through Django's e-mail backend, when configured.

Sent from a Celery task after the transaction commits, so a slow or failing receiver never
delays a run; delivery is best effort and logged. The webhook goes through the outbound guard
(docs/security.md): checked addresses only, no redirects followed, 10 s in all, 16 MiB at most.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.conf import settings
from django.core.mail import send_mail

from loops.models import ActionApproval
from orchestrator.queue import enqueue
from runtime import outbound, outbound_http

logger = logging.getLogger(__name__)
#: The webhook's whole answer, connecting included, must arrive within this many seconds.
WEBHOOK_TIMEOUT_SECONDS = 10.0


def notify_approvals(approval_ids: list[uuid.UUID]) -> None:
    if not (settings.LOOPWRIGHT["APPROVAL_WEBHOOK_URL"] or settings.LOOPWRIGHT["APPROVAL_EMAILS"]):
        return
    # A broker that is down loses the notice only: the approval is in the UI and the API.
    enqueue("loops.notify_approvals", [str(i) for i in approval_ids], retry=False)


def approval_message(approval: ActionApproval) -> dict[str, Any]:
    link = f"{settings.PUBLIC_URL}/approvals/{approval.id}"
    text = (
        f"Approval needed: {approval.role} {approval.employee_username} wants to run "
        f"`{approval.tool_name}` in run {approval.run_id} ({approval.reason}). {link}"
    )
    return {
        "text": text,
        "approval": {
            "id": str(approval.id),
            "run": str(approval.run_id),
            "tool": approval.tool_name,
            "reason": approval.reason,
            "expires_at": approval.expires_at.isoformat() if approval.expires_at else None,
        },
        "url": link,
    }


def deliver_approval_notifications(approval_ids: list[str]) -> None:
    webhook = settings.LOOPWRIGHT["APPROVAL_WEBHOOK_URL"]
    emails = [e for e in settings.LOOPWRIGHT["APPROVAL_EMAILS"].split(",") if e.strip()]
    for approval in ActionApproval.objects.filter(id__in=approval_ids):
        message = approval_message(approval)
        if webhook:
            _post_webhook(webhook, message)
        if emails:
            send_mail(
                subject=f"[Loopwright] approval needed: {approval.tool_name}",
                message=message["text"],
                from_email=None,
                recipient_list=emails,
                fail_silently=True,
            )


def _post_webhook(url: str, message: dict[str, Any]) -> None:
    """POST one notice through the outbound guard; failures are logged, never raised."""
    policy = outbound.current_policy()
    try:
        outbound_http.post_json(url, message, policy=policy, timeout=WEBHOOK_TIMEOUT_SECONDS)
    except outbound.OutboundRefused as exc:
        logger.warning("approval webhook refused: %s", exc)
    except Exception as exc:  # best effort; never fails the run
        logger.warning("approval webhook failed: %s", type(exc).__name__)
