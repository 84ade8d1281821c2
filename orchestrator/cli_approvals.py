"""``loopwright approvals``, ``approve`` and ``reject``: the pending gated calls, and one
decision on one of them, named by its id or by its run's (when the run has just one pending).

No Django and nothing of the project (``bin/loopwright`` runs the CLI as a bare file).
"""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO
from urllib.parse import quote

from orchestrator.cli_api import EXIT_OK, Api, CliError, uuid_argument
from orchestrator.cli_color import PLAIN, Palette
from orchestrator.cli_output import _short


def approval_line(approval: dict[str, Any], paint: Palette = PLAIN) -> str:
    """One pending approval: its id, run, tool and arguments, and why it asks."""
    arguments = json.dumps(approval.get("arguments"), ensure_ascii=False, sort_keys=True)
    reason = approval.get("reason") or ""
    role = paint.role(str(approval.get("role") or "?"))
    return (
        f"{approval['id']}  run {approval.get('run')}  {role}"
        f"  {approval.get('tool_name')} {_short(arguments, 160)}"
        + (f"  ({_short(reason, 120)})" if reason else "")
    )


def _pending(api: Api, run_id: str | None = None) -> list[dict[str, Any]]:
    params = {"status": "pending"} | ({"run": run_id} if run_id else {})
    found = api.request("GET", "approvals", params=params)
    return list(found.get("results", []) if isinstance(found, dict) else found)


def cmd_approvals(api: Api, args: argparse.Namespace, out: TextIO, paint: Palette) -> int:
    if args.run:
        uuid_argument("--run", args.run, "a run id")
    pending = _pending(api, args.run)
    if not pending:
        print("no pending approvals", file=out)
    for approval in pending:
        print(approval_line(approval, paint), file=out)
    return EXIT_OK


def approval_to_decide(api: Api, given: str) -> dict[str, Any]:
    """The approval ``given`` names: an approval's id, or a run's with one pending approval
    (several: an error listing them)."""
    uuid_argument("ID", given, "an approval or run id")
    try:
        approval: dict[str, Any] = api.request("GET", f"approvals/{quote(given, safe='')}")
        return approval
    except CliError as exc:
        if exc.status != 404:
            raise
    try:
        run = api.request("GET", f"runs/{quote(given, safe='')}")
    except CliError as exc:
        if exc.status == 404:
            raise CliError(f"argument ID: no approval and no run {given} at {api.url}.") from exc
        raise
    pending = _pending(api, given)
    if not pending:
        raise CliError(
            f"argument ID: run {given} has no pending approval (it is {run.get('status')})."
        )
    if len(pending) > 1:
        listed = "\n".join(f"  {approval_line(a)}" for a in pending)
        raise CliError(
            f"argument ID: run {given} has {len(pending)} pending approvals; "
            f"give the id of the one to decide:\n{listed}"
        )
    return pending[0]


def decide(api: Api, args: argparse.Namespace, out: TextIO, paint: Palette, decision: str) -> int:
    """POST the decision on the approval ``args.id`` names; print what it became."""
    body: dict[str, Any] = {"decision": decision, "reason": args.reason or ""}
    if getattr(args, "review", None) is not None:  # the API validates it against the schema
        try:
            body["review"] = json.loads(args.review)
        except ValueError as exc:
            raise CliError(f"--review is not JSON: {exc}") from exc
    approval = approval_to_decide(api, args.id)
    try:
        decided = api.request(
            "POST", f"approvals/{quote(str(approval['id']), safe='')}/decide", json=body
        )
    except CliError as exc:
        raise CliError(f"{decision} {approval['id']}: {exc}", status=exc.status) from exc
    status = str(decided.get("status", decision))
    print(
        f"approval {decided['id']} {paint.status(status)}: {decided.get('tool_name')} "
        f"{_short(decided.get('arguments'), 80)}",
        file=out,
    )
    run_id = str(decided.get("run"))
    print(f"  run {run_id}: {paint.link(api.page_url(run_id))}", file=out)
    return EXIT_OK


def cmd_approve(api: Api, args: argparse.Namespace, out: TextIO, paint: Palette) -> int:
    return decide(api, args, out, paint, "approve")


def cmd_reject(api: Api, args: argparse.Namespace, out: TextIO, paint: Palette) -> int:
    return decide(api, args, out, paint, "reject")
