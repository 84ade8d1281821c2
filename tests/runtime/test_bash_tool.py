"""The builtin ``bash`` tool: real bubblewrap sandboxes confined to the run's working directory,
no network unless the harness allows it, timeouts, output cuts, cancellation, re-issues, and its
absence where no sandbox can run."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.compile import harness_compile, layer_from_settings, profile_layer
from harness.planner import plan_tools
from harness.schema import DEFAULT_PLATFORM, HarnessSettings, layer_validate
from runtime.policy import Decision
from runtime.tools import MemoryLedger, ToolContext, ToolError, ToolResult
from runtime.tools.bash import (
    BASH_SPEC,
    BashConfig,
    BashTool,
    bash_tool,
    network_access,
    sandbox_unavailable_reason,
)
from runtime.types import Effect
from sandbox import SandboxConfig

NO_BWRAP = SandboxConfig(bwrap_path="/nonexistent/bwrap")


@pytest.fixture
def workdir() -> Iterator[Path]:
    # mkdtemp makes a 0700 parent: the sandbox uid reaches the directory without searching it.
    parent = Path(tempfile.mkdtemp(prefix="lw-bash-test-"))
    root = parent / "work"
    root.mkdir()
    (root / "notes.txt").write_text("first\n")
    (root / "src").mkdir()
    yield root
    shutil.rmtree(parent)


@pytest.fixture(scope="module")
def tool() -> BashTool:
    made = bash_tool(BashConfig())
    assert made is not None, f"the sandbox must run here: {sandbox_unavailable_reason()}"
    return made


def context(workdir: Path | None, *, seconds: float = 30, key: str = "run:1:0", **kw: Any) -> Any:
    return ToolContext(
        workdir=str(workdir) if workdir else None,
        idempotency_key=key,
        deadline=time.monotonic() + seconds,
        **kw,
    )


def bash(tool: BashTool, command: str, ctx: ToolContext, **arguments: Any) -> ToolResult:
    return asyncio.run(tool.run({"command": command, **arguments}, ctx))


def test_a_command_runs_in_the_working_directory_and_its_writes_land_there(
    tool: BashTool, workdir: Path
) -> None:
    owner = os.stat(workdir)
    result = bash(
        tool,
        "pwd; cat notes.txt; echo second >> notes.txt; mkdir -p src/pkg && echo x > src/pkg/f; "
        "echo oops >&2; exit 3",
        context(workdir),
    )
    assert not result.is_error
    assert result.content.startswith("exit code: 3\n")
    assert "stdout:\n/workdir\nfirst\n" in result.content
    assert "stderr:\noops" in result.content
    assert (workdir / "notes.txt").read_text() == "first\nsecond\n"
    assert (workdir / "src" / "pkg" / "f").read_text() == "x\n"
    # The directory was lent to the sandbox's uid for the command and handed back after it.
    for path in (workdir, workdir / "notes.txt", workdir / "src" / "pkg", workdir / "src/pkg/f"):
        assert (os.stat(path).st_uid, os.stat(path).st_gid) == (owner.st_uid, owner.st_gid)


def test_nothing_of_the_host_is_visible_or_writable(
    tool: BashTool, workdir: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "outside.txt"
    secret.write_text("host secret")
    repo = Path(__file__).resolve().parents[2]
    result = bash(
        tool,
        f"cat {secret} 2>&1; ls {repo} 2>&1; ls /root 2>&1; cat /etc/shadow 2>&1; "
        "touch /usr/evil 2>&1; echo $HOME; env | grep -c -i -e secret -e database -e redis",
        context(workdir),
    )
    assert "host secret" not in result.content
    assert "No such file or directory" in result.content
    assert "Read-only file system" in result.content
    assert "/workdir" in result.content
    assert not Path("/usr/evil").exists()


def test_a_symlink_planted_by_the_command_is_not_followed_when_the_directory_is_returned(
    tool: BashTool, workdir: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("v")
    os.chown(victim, 4242, 4242)
    bash(tool, f"ln -s {victim} link; ln -s / root-link", context(workdir))
    assert (workdir / "link").is_symlink()
    assert (os.stat(victim).st_uid, os.stat(victim).st_gid) == (4242, 4242)
    assert os.stat("/").st_uid == 0


@pytest.fixture
def listener() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.sendall(b"hello from the host\n")
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


CONNECT = "exec 3<>/dev/tcp/127.0.0.1/{port} && head -n1 <&3 || echo unreachable"


def test_the_network_is_denied_by_default_and_when_restricted(
    tool: BashTool, workdir: Path, listener: int
) -> None:
    result = bash(tool, CONNECT.format(port=listener), context(workdir))
    assert "unreachable" in result.content and "hello" not in result.content
    with network_access({"isolation": {"networkAccess": "restricted"}}):
        result = bash(tool, CONNECT.format(port=listener), context(workdir))
    assert "unreachable" in result.content


def test_the_network_is_shared_when_the_harness_allows_it(
    tool: BashTool, workdir: Path, listener: int
) -> None:
    async def both() -> tuple[ToolResult, ToolResult]:
        with network_access({"isolation": {"networkAccess": "allow"}}):
            allowed = await tool.run({"command": CONNECT.format(port=listener)}, context(workdir))
        # Outside the scope (another invocation) the default, deny, applies again.
        denied = await tool.run({"command": CONNECT.format(port=listener)}, context(workdir))
        return allowed, denied

    allowed, denied = asyncio.run(both())
    assert "hello from the host" in allowed.content
    assert "unreachable" in denied.content


def test_the_command_is_killed_at_its_timeout(tool: BashTool, workdir: Path) -> None:
    started = time.monotonic()
    result = bash(tool, "echo started; sleep 30; echo never", context(workdir), timeout_seconds=1)
    assert time.monotonic() - started < 10
    assert result.is_error
    assert "killed: timed out after 1 s" in result.content
    assert "started" in result.content and "never" not in result.content


def test_the_loop_deadline_bounds_the_command_before_the_loop_abandons_it(
    tool: BashTool, workdir: Path
) -> None:
    result = bash(tool, "sleep 30", context(workdir, seconds=2.5))
    assert result.is_error and "timed out" in result.content


def test_output_is_cut_at_the_tools_maximum(workdir: Path) -> None:
    small = BashTool(BashConfig(max_output_chars=1000))
    result = bash(small, "head -c 200000 /dev/zero | tr '\\0' 'a'", context(workdir))
    assert "[output truncated: showing the first" in result.content
    assert len(result.content) < 1200


def test_a_flood_of_output_is_capped_and_killed(workdir: Path) -> None:
    capped = BashTool(BashConfig(output_cap_bytes=64 * 1024))
    result = bash(capped, "yes", context(workdir))
    assert result.is_error and "killed: too much output" in result.content


def _alive(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(pid))
    return found


def test_cancelling_the_call_kills_the_command_and_returns_the_directory(
    tool: BashTool, workdir: Path
) -> None:
    marker = "4242.4242"

    async def cancel_midway() -> None:
        task = asyncio.ensure_future(tool.run({"command": f"sleep {marker}"}, context(workdir)))
        for _ in range(100):
            await asyncio.sleep(0.1)
            if _alive(f"sleep\x00{marker}"):
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_midway())
    assert _alive(f"sleep\x00{marker}") == []
    assert os.stat(workdir).st_uid == os.geteuid()


def test_a_reissued_call_that_had_finished_is_not_run_again(workdir: Path) -> None:
    ledger = MemoryLedger()
    counting = BashTool(BashConfig(ledger=ledger))
    command = "echo run >> count.txt; echo key=$LOOPWRIGHT_IDEMPOTENCY_KEY"
    first = bash(counting, command, context(workdir, key="r:3:1"))
    assert "key=r:3:1" in first.content
    again = bash(counting, command, context(workdir, key="r:3:1", reissued=True))
    assert (workdir / "count.txt").read_text() == "run\n"
    assert "not run again" in again.content and "key=r:3:1" in again.content
    # A re-issue with no record (the crash came before the command finished) runs it.
    bash(counting, command, context(workdir, key="r:4:0", reissued=True))
    assert (workdir / "count.txt").read_text() == "run\nrun\n"


def test_without_a_working_directory_the_call_is_refused(tool: BashTool) -> None:
    with pytest.raises(ToolError, match="no working directory"):
        bash(tool, "true", context(None))


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root runner lends dedicated uids")
def test_a_working_directory_under_a_private_parent_works_and_the_parent_stays_hidden(
    tool: BashTool, tmp_path: Path
) -> None:
    # A checkout in a 0700 home: the sandbox uid cannot search the parents, and needs not.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "sibling.txt").write_text("not for the sandbox")
    work = private / "work"
    work.mkdir()
    result = bash(
        tool,
        "echo made > made.txt; ls -a ..; cat ../sibling.txt 2>&1; "
        "grep -c sibling /proc/self/mountinfo",
        context(work),
    )
    assert result.content.startswith("exit code: "), result.content
    assert (work / "made.txt").read_text() == "made\n"
    assert "not for the sandbox" not in result.content
    assert "No such file or directory" in result.content
    for path in (work, work / "made.txt"):
        assert (os.stat(path).st_uid, os.stat(path).st_gid) == (os.geteuid(), os.getegid())


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root runner lends dedicated uids")
def test_a_directory_left_lent_by_a_killed_runner_is_reclaimed_before_the_next_command(
    tool: BashTool, workdir: Path
) -> None:
    # What a worker SIGKILLed mid-command leaves: the tree still owned by a sandbox uid.
    config = SandboxConfig.from_env()
    lent = config.uid_base + 3
    (workdir / "src" / "made-by-sandbox").write_text("x")
    for path in (workdir, workdir / "notes.txt", workdir / "src", workdir / "src/made-by-sandbox"):
        os.chown(path, lent, lent)
    result = bash(tool, "echo again >> notes.txt; stat -c %u notes.txt", context(workdir))
    assert result.content.startswith("exit code: 0"), result.content
    assert (workdir / "notes.txt").read_text() == "first\nagain\n"
    for path in (workdir, workdir / "notes.txt", workdir / "src/made-by-sandbox"):
        assert (os.stat(path).st_uid, os.stat(path).st_gid) == (os.geteuid(), os.getegid())


def test_bash_is_absent_where_no_sandbox_can_run() -> None:
    assert "not installed" in (sandbox_unavailable_reason(NO_BWRAP) or "")
    assert bash_tool(BashConfig(sandbox=NO_BWRAP)) is None


def test_the_agent_invoker_registers_bash_where_the_sandbox_runs(settings: Any) -> None:
    from loops.worker.invoker import AgentInvoker
    from runtime.tools.specs import tool_spec

    assert "bash" in AgentInvoker().tools
    assert tool_spec("bash") == BASH_SPEC


def test_bash_declares_an_external_effect_and_the_default_plan_gates_it() -> None:
    assert BASH_SPEC.effect is Effect.EXTERNAL
    platform = layer_from_settings("platform", HarnessSettings.model_validate(DEFAULT_PLATFORM))
    for tools in ({"allow": ["*"]}, {"allow": ["bash"]}, {}):
        profile = profile_layer("profile:t@1", layer_validate({"tools": tools}))
        planned = plan_tools(harness_compile([platform, profile]), [BASH_SPEC]).tools[0]
        assert planned.decision is Decision.ASK, (tools, planned.reason)
