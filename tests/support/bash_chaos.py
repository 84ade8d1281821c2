"""Shared parts of the tests that kill workers during ``bash`` (docs/reliability.md P7).

A scripted model for the loopback model server (leader plans, maker runs one ``bash`` command
and reports, verifier passes or rejects as the run's label says), a git repository for the
runs' worktrees, the command whose side effect is made once through its idempotency key, and
checks of what a killed ``bash`` could leave: a workspace still lent to a sandbox uid, or one
git refuses. ``bash`` is a high-risk tool: at L1 each call waits for a human (:func:`start_approver`
plays the approver), only L3 (:func:`autonomous_on`) runs it ungated.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from django.db import connection

from loops.models import ActionApproval, ApprovalStatus, RunStatus
from loops.services.approvals import approval_decide
from loops.services.workspaces import workspace_path
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import user_ensure
from orchestrator.agents.services import employee_create, model_endpoint_create
from orchestrator.errors import Conflict
from sandbox import SandboxConfig
from tests.support.approvals import (
    LEADER,
    MAKER,
    PLAN,
    VERDICT,
    approval_pattern,
    inputs_of,
    role_of,
    tool_results,
)
from tests.support.model_server import Completion, RecordedRequest

VERIFIER = "bash-chaos-verifier"
#: Each attempt is logged; the effect (a line in effects.log) is made once per idempotency key,
#: as the bash tool's contract asks of a command that may be re-run after a crash.
COMMAND = (
    'key="$LOOPWRIGHT_IDEMPOTENCY_KEY"; echo "$key" >> attempts.log; touch started.flag; '
    "sleep {sleep}; "
    'grep -qxF "$key" effects.log 2>/dev/null || echo "$key" >> effects.log; '
    "echo attempts=$(wc -l < attempts.log)"
)
REJECT = {"verdict": "reject", "reasons": ["the label asks for a rejection"], "checks": []}


def bash_command(sleep: float) -> str:
    return COMMAND.format(sleep=sleep)


def script_reply(sleep: float) -> Any:
    """The model: leader plans; the maker runs ``bash_command(sleep)`` once, then reports;
    the verifier passes, or rejects a run whose label starts with ``reject``."""

    def reply(request: RecordedRequest) -> Completion:
        messages = request.body["messages"]
        role = role_of(messages)
        if role == "leader":
            return Completion(content=json.dumps(PLAN))
        if role == "verifier":
            label = str(inputs_of(messages).get("label", ""))
            return Completion(content=json.dumps(REJECT if label.startswith("reject") else VERDICT))
        results = tool_results(messages)
        if results:
            return Completion(content="Done: " + " | ".join(results))
        arguments = json.dumps({"command": bash_command(sleep)})
        call = {
            "id": "call_bash",
            "type": "function",
            "function": {"name": "bash", "arguments": arguments},
        }
        return Completion(content=None, tool_calls=[call])

    return reply


def git_repository(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "README").write_text("hello\n")
    for args in (
        ["init", "-q", "-b", "main"],
        ["add", "README"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first"],
    ):
        subprocess.run(["git", *args], cwd=path, check=True)
    return path


def with_autonomy(
    level: str, repository: Path, auto_allowlist: list[str], **policy: Any
) -> dict[str, Any]:
    """Pattern fields for autonomy ``level`` (L2 or L3) on ``repository`` whose tools in
    ``auto_allowlist`` run without a human gate. The registration check allows that for write
    tools from L2 and for high-risk ones (``bash``) at L3 only; both levels need a repository
    identity and worktree isolation. ``policy`` adds to the policy. A run the verifier passes
    ends ``waiting_human`` (:data:`PASSED`): a human accepts the result."""
    harness = dict(policy.pop("harness", None) or {})
    isolation = {**(harness.get("isolation") or {}), "requireWorktree": True}
    return {
        "autonomy_level": level,
        "repository_key": repository.name,
        "repository_root": str(repository),
        "base_ref": "main",
        "acting_on": ["."],
        "policy": {
            "approvals": {"autoAllowlist": list(auto_allowlist)},
            "harness": {**harness, "isolation": isolation},
            **policy,
        },
    }


def autonomous_on(repository: Path, **policy: Any) -> dict[str, Any]:
    """L3 fields whose maker runs ``bash`` (high-risk) without a human gate."""
    return with_autonomy("L3", repository, ["bash"], **policy)


#: How a run of :func:`with_autonomy` the verifier passed ends: a human accepts the result.
PASSED = (RunStatus.WAITING_HUMAN, "awaiting_acceptance")


def bash_pattern(key: str, model_url: str, repository: Path, **policy: Any) -> Any:
    """An L1 pattern on ``repository`` whose maker runs ``bash`` behind a human gate (``bash``
    is high-risk: at L1 every call asks); ``policy`` adds to its policy. Approve the calls
    with :func:`start_approver`."""
    endpoint = model_endpoint_create(
        name=f"{key}-loopback",
        provider="openai",
        base_url=model_url,
        model="bash-chaos-script",
        max_retries=0,
        timeout_seconds=120,
    )
    employee_create(username=LEADER, endpoint=endpoint, tools=["read", "list"])
    employee_create(username=MAKER, endpoint=endpoint, tools=["bash", "read"])
    employee_create(username=VERIFIER, endpoint=endpoint, tools=["read"])
    return approval_pattern(
        key,
        verifier_username=VERIFIER,
        repository_root=str(repository),
        base_ref="main",
        policy=policy,
    )


def approve_open(pattern: Any, approver: Any) -> int:
    """Approve every pending approval of ``pattern``'s runs waiting for one; how many."""
    approved = 0
    pending = ActionApproval.objects.filter(
        run__pattern=pattern,
        status=ApprovalStatus.PENDING,
        run__status=RunStatus.WAITING_APPROVAL,
    ).values_list("id", flat=True)
    for approval_id in list(pending):
        try:
            approval_decide(approval_id=approval_id, user=approver, decision="approve")
        except Conflict:
            continue  # decided or withdrawn meanwhile
        approved += 1
    return approved


class Approver:
    """A person with the approver role approving a pattern's gated calls as they open, on a
    thread of its own (its own database connection). Managed like the test's other processes
    (:func:`start_approver` puts it in ``procs``, whose teardown calls :meth:`kill`)."""

    name = "bash-approver"

    def __init__(self, pattern: Any, interval: float = 0.05) -> None:
        self.pattern, self.interval = pattern, interval
        self.approved = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)

    def start(self) -> Approver:
        self._thread.start()
        return self

    def _loop(self) -> None:
        approver = user_ensure(username=self.name, roles=(Role.APPROVER,))
        try:
            while not self._stop.is_set():
                try:
                    self.approved += approve_open(self.pattern, approver)
                except Exception as exc:  # reported in log(); the test goes on
                    self.errors.append(repr(exc))
                self._stop.wait(self.interval)
        finally:
            connection.close()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def kill(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def log(self) -> str:
        return f"approved {self.approved} call(s); errors: {self.errors[-5:]}"


def start_approver(procs: list[Any], pattern: Any) -> Approver:
    """Approve ``pattern``'s gated calls (``bash`` at L1) until the test's teardown."""
    approver = Approver(pattern).start()
    procs.append(approver)
    return approver


def sandbox_uids() -> range:
    return SandboxConfig.from_env().sandbox_uids()


def lent(path: Path) -> bool:
    """Is the workspace's top still owned by a sandbox uid (a command was running)?"""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    return info.st_uid in sandbox_uids() or info.st_gid in sandbox_uids()


def foreign_entries(path: Path) -> list[str]:
    """Entries of a workspace not owned by this (the service) user, links not followed."""
    me = (os.geteuid(), os.getegid())
    found = []
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [".", *dirnames, *filenames]:
            full = os.path.join(dirpath, name)
            info = os.lstat(full)
            if (info.st_uid, info.st_gid) != me:
                found.append(f"{full} ({info.st_uid}:{info.st_gid})")
    return found


def git_refusal(path: Path) -> str:
    """What git says about the workspace ("" when it works)."""
    done = subprocess.run(
        ["git", "status", "--porcelain"], cwd=path, capture_output=True, text=True, check=False
    )
    return "" if done.returncode == 0 else done.stderr.strip()


def lines(path: Path) -> Counter[str]:
    return Counter(path.read_text().split()) if path.exists() else Counter()


def workspace_of(run_id: Any) -> Path:
    return workspace_path(run_id)
