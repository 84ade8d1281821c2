"""Shared parts of the tests that kill workers during ``bash`` (docs/reliability.md P7).

A scripted model for the loopback model server (leader plans, maker runs one ``bash`` command
and reports, verifier passes or rejects as the run's label says), a git repository for the
runs' worktrees, the command whose side effect is made once through its idempotency key, and
checks of what a killed ``bash`` could leave: a workspace still lent to a sandbox uid, or one
git refuses.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from loops.services.workspaces import workspace_path
from orchestrator.agents.services import employee_create, model_endpoint_create
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


def bash_pattern(key: str, model_url: str, repository: Path, **policy: Any) -> Any:
    """An L1 pattern on ``repository`` whose maker may run ``bash`` (no human gate);
    ``policy`` adds to its policy."""
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
        policy={"approvals": {"autoAllowlist": ["bash"]}, **policy},
    )


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
