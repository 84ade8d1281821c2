"""The harness's ``paths`` and network bind a real run through the engine (issue 18).

A profile with ``paths.deny: ["secrets/**"]`` and ``paths.maxFiles: 1`` is compiled into the
run's snapshots as ``run_trigger`` does; the production ``drive_run`` drives the run in this
process with the real tool loop, the real builtin file tools and the fenced journal, on the
database the suite runs on (SQLite or PostgreSQL). Only the model is scripted: the maker reads
``secrets/key.txt``, lists the workspace, writes two files, then answers. The read is a refused
tool call: the model sees the refusal (never the secret), and the run's tool step records it with
the setting, the glob and the layer that set it. A second run's maker reaches a loopback HTTP
server from ``bash`` only through the host ``isolation.allowedHosts`` names.
"""

from __future__ import annotations

import asyncio
import http.server
import itertools
import json
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

import pytest
from django.db import DEFAULT_DB_ALIAS, connections

from harness.services import profile_create
from loops.models import LoopRun, LoopStep, RunStatus
from loops.policy import parse_policy
from loops.services.claims import run_claim
from loops.services.runs import role_harness_snapshots
from loops.services.workspaces import workspace_path
from loops.worker.engine import drive_run
from runtime import outbound
from runtime.invocation import InvocationOutcome, InvocationRequest, NothingToPrepare, StepJournal
from runtime.loop import LoopSettings, ToolLoopInvoker
from runtime.outbound import OutboundPolicy
from runtime.policy import ToolPolicy
from runtime.tools import FileToolConfig, builtin_registry
from runtime.tools.bash import BashConfig, bash_tool, sandbox_unavailable_reason
from tests.support.factories import make_pattern, make_run
from tests.support.limits import LoopingModel, snapshot

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("seeded_profiles")]

_tags = itertools.count(1)
SECRET = "s3cret-value-0042"


def maker_script(messages: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]] | None:
    made = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
    turns: list[list[tuple[str, dict[str, Any]]]] = [
        [("read", {"path": "secrets/key.txt"})],
        [("list", {"path": ".", "recursive": True})],
        [("write", {"path": "out.txt", "content": "one"})],
        [("write", {"path": "second.txt", "content": "two"})],
    ]
    return turns[made] if made < len(turns) else None


class _Invoker(NothingToPrepare):
    def __init__(self, model: LoopingModel) -> None:
        self.model = model
        self.tools = builtin_registry(FileToolConfig())
        if (bash := bash_tool(BashConfig())) is not None:
            self.tools.register(bash)

    async def invoke(
        self, request: InvocationRequest, journal: StepJournal, prepared: Any = None
    ) -> InvocationOutcome:
        policy = ToolPolicy.from_decisions({name: "allow" for name in self.tools.names()})
        loop = ToolLoopInvoker(
            model_clients=lambda _username: self.model,
            tools=self.tools,
            policy=lambda _request: policy,
            settings=LoopSettings(max_steps=20),
        )
        return await loop.invoke(request, journal)


class _Driver:
    def __init__(self, invoker: _Invoker) -> None:
        self.invoker = invoker

    async def db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


def drive(run_id: uuid.UUID, model: LoopingModel) -> str:
    [claim] = run_claim(owner="inline", lease_seconds=300, run_id=run_id)
    outer = connections[DEFAULT_DB_ALIAS]

    async def main() -> None:
        connections[DEFAULT_DB_ALIAS] = outer
        await drive_run(_Driver(_Invoker(model)), claim)  # type: ignore[arg-type]

    with mock.patch.dict(os.environ, {"DJANGO_ALLOW_ASYNC_UNSAFE": "true"}):
        asyncio.run(main())
    return str(LoopRun.objects.get(pk=run_id).status)


def paths_run(settings: dict[str, Any]) -> tuple[LoopRun, str]:
    tag = f"paths-{next(_tags)}-{uuid.uuid4().hex[:6]}"
    profile_create(tag=tag, settings=settings)
    pattern = make_pattern(leader_harness_tag=tag, maker_harness_tag=tag, verifier_harness_tag=tag)
    snapshots = role_harness_snapshots(pattern, parse_policy(pattern.policy), None)
    run = make_run(pattern, policy_snapshot=snapshot(pattern.policy), harness_snapshots=snapshots)
    # The run's workspace (no repository: a plain directory the engine reuses) with a secret.
    workdir = workspace_path(run.id)
    (workdir / "secrets").mkdir(parents=True)
    (workdir / "secrets" / "key.txt").write_text(SECRET)
    (workdir / "README.md").write_text("hello\n")
    return run, f"profile:{tag}@1"


def test_a_makers_read_of_a_denied_path_is_a_refused_call_in_the_runs_steps() -> None:
    run, layer = paths_run({"paths": {"deny": ["secrets/**"], "maxFiles": 1}})
    model = LoopingModel(maker_turn=maker_script)
    try:
        assert drive(run.id, model) == RunStatus.SUCCEEDED
        steps = {
            (s.name, json.dumps(s.request.get("arguments"), sort_keys=True)): s
            for s in LoopStep.objects.filter(run=run, kind="tool", role="maker")
        }
        read = next(s for (name, _), s in steps.items() if name == "read")
        refusal = f"refused by paths.deny 'secrets/**' (set by {layer})"
        assert refusal in read.error or refusal in json.dumps(read.response)
        listed = next(s for (name, _), s in steps.items() if name == "list")
        assert "README.md" in json.dumps(listed.response)
        assert "secrets" not in json.dumps(listed.response)
        writes = sorted(
            (s.request["arguments"]["path"], s) for (n, _), s in steps.items() if n == "write"
        )
        (first, ok), (second, over) = writes
        assert (first, second) == ("out.txt", "second.txt")
        assert f"paths.maxFiles = 1 (set by {layer})" in over.error + json.dumps(over.response)
        assert "maxFiles" not in ok.error + json.dumps(ok.response)
        # What the model saw: the refusal, never the secret.
        seen = json.dumps([r.messages for r in model.requests])
        assert refusal in seen and SECRET not in seen
        workdir = workspace_path(run.id)
        assert (workdir / "out.txt").exists() and not (workdir / "second.txt").exists()
    finally:
        shutil.rmtree(workspace_path(run.id), ignore_errors=True)


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello from the allowed host"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def fetch_command(host: str, port: int) -> str:
    return (
        'python3 -c "import urllib.request as u\n'
        f"try: print(u.urlopen('http://{host}:{port}/', timeout=5).read().decode())\n"
        "except Exception as e: print('refused:', e)\""
    )


def test_a_makers_bash_reaches_only_the_hosts_of_a_restricted_network() -> None:
    assert sandbox_unavailable_reason() is None, "the sandbox must run here"
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = int(httpd.server_address[1])
    outbound.configure(OutboundPolicy(private="allow"))  # loopback stands in for the internet
    isolation = {"networkAccess": "restricted", "allowedHosts": ["localhost"]}
    run, _layer = paths_run({"tools": {"allow": ["*"]}, "isolation": isolation})

    def turn(messages: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]] | None:
        made = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
        hosts = ["localhost", "127.0.0.1"]  # the second is not in allowedHosts
        return [("bash", {"command": fetch_command(hosts[made], port)})] if made < 2 else None

    try:
        assert drive(run.id, LoopingModel(maker_turn=turn)) == RunStatus.SUCCEEDED
        calls = LoopStep.objects.filter(run=run, kind="tool", name="bash").order_by("seq")
        allowed, other = (json.dumps(s.response) for s in calls)
        assert "hello from the allowed host" in allowed, allowed
        assert "hello" not in other and "refused:" in other, other
    finally:
        outbound.configure(None)
        httpd.shutdown()
        httpd.server_close()
        shutil.rmtree(workspace_path(run.id), ignore_errors=True)
