"""The approvals inbox: pages of 20 pending approvals by cursor, a gated ``write`` or ``edit``
shown as a diff against the file in the run's workspace (never a file outside it or a denied
one), and approve or reject from the queue, a rejection needing its reason."""

from __future__ import annotations

import html as html_module
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from loops.models import ActionApproval, LoopRun
from tests.support.approvals import approval_pattern, park_directly, write_call

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("seeded_profiles")]
ClientAs = Callable[[str], Client]


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.status_code
    return html_module.unescape(response.content.decode())


def parked(key: str, call: tuple[str, dict[str, Any]], workdir: Path | None = None) -> LoopRun:
    run = park_directly(approval_pattern(key), [call])
    if workdir is not None:
        LoopRun.objects.filter(pk=run.pk).update(cursor={**run.cursor, "workdir": str(workdir)})
    return run


def test_a_write_and_an_edit_show_their_diff_against_the_file(
    client_as: ClientAs, tmp_path: Path
) -> None:
    (tmp_path / "notes.txt").write_text("hello\nold line\n")
    (tmp_path / ".env").write_text("SECRET=hunter2\n")
    (tmp_path.parent / "outside.txt").write_text("not yours\n")
    parked("q-write", write_call("notes.txt", "hello\nnew line\n"), tmp_path)
    parked(
        "q-edit", ("edit", {"path": "notes.txt", "old_text": "hello", "new_text": "hi"}), tmp_path
    )
    parked("q-env", write_call(".env", "SECRET=x\n"), tmp_path)
    parked("q-out", write_call("../outside.txt", "mine\n"), tmp_path)
    text = page(client_as("approver"), "/approvals")
    assert '<span class="diff-del">-old line</span>' in text
    assert '<span class="diff-add">+new line</span>' in text
    assert (
        '<span class="diff-add">+hi</span>' in text
        and '<span class="diff-del">-hello</span>' in text
    )
    assert "hunter2" not in text and "not yours" not in text
    assert "the current file cannot be shown" in text  # .env and ../outside.txt
    assert "Keys:" in text and "Keys:" not in page(client_as("viewer"), "/approvals")


def test_the_queue_pages_by_cursor(client_as: ClientAs) -> None:
    pattern = approval_pattern("q-many")
    for n in range(23):
        park_directly(pattern, [write_call(f"f{n}.txt", "x")])
    client = client_as("viewer")
    first = page(client, "/approvals")
    assert first.count('data-approval="') == 20 and 'Pending <span class="muted">(23)' in first
    second = page(client, first.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0])
    assert second.count('data-approval="') == 3 and 'rel="prev"' in second
    ids = {part.split('"')[0] for part in (first + second).split('data-approval="')[1:]}
    assert len(ids) == 23
    back = page(client, second.split('rel="prev"')[0].rsplit('href="', 1)[1].split('"')[0])
    assert back.count('data-approval="') == 20 and 'rel="prev"' not in back


def test_approve_and_reject_from_the_queue_a_rejection_needs_a_reason(
    client_as: ClientAs,
) -> None:
    first = parked("q-a", write_call("a.txt", "a"))
    second = parked("q-b", write_call("b.txt", "b"))
    client = client_as("approver")
    one, two = (ActionApproval.objects.get(run=r) for r in (first, second))
    form = {"from": "queue", "next": "/approvals"}
    answer = client.post(f"/approvals/{one.id}/decide", {**form, "decision": "approve"})
    assert answer.status_code == 302 and answer["Location"] == "/approvals"
    no_reason = client.post(
        f"/approvals/{two.id}/decide", {**form, "decision": "reject"}, follow=True
    )
    assert "Give a reason to reject" in no_reason.content.decode()
    two.refresh_from_db()
    assert two.status == "pending"
    client.post(f"/approvals/{two.id}/decide", {**form, "decision": "reject", "reason": "no"})
    one.refresh_from_db()
    two.refresh_from_db()
    assert (one.status, two.status, two.decision_reason) == ("approved", "rejected", "no")
