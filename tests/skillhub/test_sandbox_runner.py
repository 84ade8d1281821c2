"""The sandbox runner's ordinary behaviour: results, inputs, outputs, network, backends.

The hostile programs are in test_sandbox_battery.py; these tests drive real sandboxes too.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import (
    KilledReason,
    Language,
    SandboxConfig,
    SandboxLimits,
    SandboxRequest,
    SandboxRequestError,
    SandboxUnavailable,
    probe_backend,
    run_sandboxed,
    run_sandboxed_async,
    sandbox_reap_stale,
)
from sandbox.runner import killed_reason
from sandbox.types import MiB
from sandbox.workdir import OutputCaps, outputs_collect

NO_BWRAP = SandboxConfig(bwrap_path="/nonexistent/bwrap")


def python(code: str, **kwargs: Any) -> SandboxRequest:
    return SandboxRequest(language="python", code=code, **kwargs)


def node(code: str, **kwargs: Any) -> SandboxRequest:
    return SandboxRequest(language="node", code=code, **kwargs)


# --- normal runs -----------------------------------------------------------------------------


def test_a_python_skill_returns_stdout_and_an_output_file() -> None:
    result = run_sandboxed(
        python(
            "import json, sys\n"
            "args = json.load(sys.stdin)\n"
            "open('out/report.txt', 'w').write('sum=%d' % sum(args['numbers']))\n"
            "print(json.dumps({'count': len(args['numbers'])}))\n",
            stdin=json.dumps({"numbers": [1, 2, 3]}),
            collect_outputs="*.txt",
        )
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {"count": 3}
    assert [(f.name, f.data) for f in result.output_files] == [("report.txt", b"sum=6")]
    assert result.backend == "bubblewrap"
    assert result.killed_reason is None and not result.timed_out
    assert result.leftover_processes == 0


def test_a_node_skill_returns_stdout_stderr_and_exit_code() -> None:
    result = run_sandboxed(
        node("console.log('hello'); console.error('warn'); process.exitCode = 3;")
    )
    assert (result.stdout, result.stderr, result.exit_code) == ("hello\n", "warn\n", 3)
    assert result.killed_reason is None


@pytest.mark.parametrize("language", ["python", "node"])
def test_json_stdin_arrives_verbatim(language: Language) -> None:
    hostile = '"); import os; os.system("id") #'
    payload = json.dumps({"text": hostile, "unicode": "żółw ✓", "nested": {"a": [1, None]}})
    code = {
        "python": "import sys; sys.stdout.write(sys.stdin.read())",
        "node": "process.stdin.pipe(process.stdout)",
    }[language]
    result = run_sandboxed(SandboxRequest(language=language, code=code, stdin=payload))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == payload
    assert "uid=" not in result.stdout


def test_input_files_are_placed_in_the_working_directory() -> None:
    result = run_sandboxed(
        python(
            "import os\nprint(open('data/in.csv').read(), os.getcwd(), os.environ['SKILL_MODE'])\n",
            files={"data/in.csv": b"a,b\n1,2"},
            env={"SKILL_MODE": "test"},
        )
    )
    assert result.stdout.split() == ["a,b", "1,2", "/workdir", "test"]


def test_a_large_stdin_is_fed_while_output_is_read() -> None:
    data = "x" * (4 * MiB)  # far beyond a pipe buffer in both directions
    result = run_sandboxed(
        python(
            "import sys; sys.stdout.write(sys.stdin.read())", stdin=data, output_cap_bytes=8 * MiB
        )
    )
    assert len(result.stdout) == len(data) and not result.stdout_truncated


def test_a_program_that_ignores_its_stdin_still_finishes() -> None:
    result = run_sandboxed(python("print('done')", stdin="y" * (2 * MiB)))
    assert result.stdout == "done\n" and result.exit_code == 0


def test_stderr_is_capped_separately_from_stdout() -> None:
    result = run_sandboxed(
        python(
            "import sys; print('ok', flush=True); sys.stderr.write('e' * 100000)",
            output_cap_bytes=1000,
        )
    )
    assert result.stdout == "ok\n" and not result.stdout_truncated
    assert len(result.stderr) == 1000 and result.stderr_truncated
    assert result.killed_reason == "output_cap"


def test_output_exactly_at_the_cap_is_not_truncated() -> None:
    result = run_sandboxed(
        python("import sys; sys.stdout.write('z' * 5000)", output_cap_bytes=5000)
    )
    assert len(result.stdout) == 5000 and not result.stdout_truncated
    assert result.killed_reason is None


def test_node_heap_exhaustion_is_reported_as_memory() -> None:
    result = run_sandboxed(
        node("const a = []; for (;;) a.push(new Array(1e6).fill(1.5));", timeout_seconds=30)
    )
    assert result.killed_reason == "memory", result.stderr[-500:]


def test_a_file_larger_than_the_file_size_limit_is_refused() -> None:
    result = run_sandboxed(
        python(
            "import signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "try:\n"
            "    open('big', 'wb').write(b'x' * 2_000_000)\n"
            "except OSError as exc:\n"
            "    print('refused', exc.errno)\n",
            limits=SandboxLimits(file_size_bytes=1_000_000),
        )
    )
    assert result.stdout.strip() == "refused 27"  # EFBIG


@pytest.mark.parametrize(
    ("language", "code"),
    [
        ("python", "open('big', 'wb').write(b'x' * 2_000_000)"),
        ("node", "require('fs').writeFileSync('big', Buffer.alloc(2_000_000))"),
    ],
)
def test_passing_the_file_size_limit_is_reported(language: Language, code: str) -> None:
    limits = SandboxLimits(file_size_bytes=1000)
    result = run_sandboxed(SandboxRequest(language=language, code=code, limits=limits))
    assert result.killed_reason == "file_size", (result.exit_code, result.stderr[-300:])


def test_the_private_tmp_is_bounded() -> None:
    result = run_sandboxed(
        python(
            "try:\n"
            "    open('/tmp/fill', 'wb').write(b'x' * 3_000_000)\n"
            "except OSError as exc:\n"
            "    print('full', exc.errno)\n",
            limits=SandboxLimits(tmpfs_bytes=1_000_000),
        )
    )
    assert result.stdout.strip() == "full 28"  # ENOSPC


def test_memory_spread_over_processes_is_killed_by_the_watchdog() -> None:
    # Each child stays under RLIMIT_AS; together they pass memory_bytes.
    code = (
        "import os, time\n"
        "for _ in range(6):\n"
        "    if os.fork() == 0:\n"
        "        hoard = b'x' * (150 * 1024 * 1024)\n"
        "        time.sleep(60)\n"
        "time.sleep(60)\n"
    )
    result = run_sandboxed(
        python(code, timeout_seconds=20, limits=SandboxLimits(memory_bytes=400 * MiB))
    )
    assert result.killed_reason == "memory" and not result.timed_out
    assert result.duration_ms < 10_000
    assert result.leftover_processes == 0


def test_the_async_variant_runs_concurrently() -> None:
    async def three() -> list[str]:
        results = await asyncio.gather(
            *(
                run_sandboxed_async(python(f"import time; time.sleep(1); print({i})"))
                for i in range(3)
            )
        )
        return [r.stdout.strip() for r in results]

    assert asyncio.run(three()) == ["0", "1", "2"]


def test_the_sync_api_refuses_to_run_inside_an_event_loop() -> None:
    async def call() -> None:
        run_sandboxed(python("print(1)"))

    with pytest.raises(RuntimeError, match="run_sandboxed_async"):
        asyncio.run(call())


def test_secrets_in_the_program_env_are_not_on_any_command_line() -> None:
    token = f"tok-{uuid.uuid4().hex}"
    code = "import time; print('up', flush=True); time.sleep(3)"
    seen: list[bool] = []

    def look() -> None:
        for pid in os.listdir("/proc"):
            try:
                if pid.isdigit() and token.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    seen.append(True)
            except OSError:
                pass

    async def run_and_look() -> str:
        task = asyncio.create_task(
            run_sandboxed_async(python(code, env={"API_TOKEN": token}, timeout_seconds=10))
        )
        await asyncio.sleep(1.5)
        await asyncio.to_thread(look)
        return (await task).stdout

    assert asyncio.run(run_and_look()) == "up\n"
    assert seen == []


def test_sandboxes_die_with_a_runner_that_is_killed() -> None:
    """A worker killed mid-run (OOM, deploy, kill -9) must not leave its sandboxes running."""
    marker = f"lw-marker-{uuid.uuid4().hex}"
    program = (
        "import subprocess, time\n"
        f"subprocess.Popen(['/usr/bin/python3', '-c', 'import time; time.sleep(1000)', {marker!r}])\n"
        "time.sleep(1000)\n"
    )
    runner = subprocess.Popen(  # the program goes through stdin: the marker is in no argv
        [sys.executable, "-c", RUNNER_SCRIPT],
        stdin=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert runner.stdin is not None
    runner.stdin.write(program.encode())
    runner.stdin.close()
    config = SandboxConfig.from_env()
    try:
        assert _wait_for(lambda: bool(_processes_with(marker)), seconds=20), "never started"
        uids = {_uid_of(pid) for pid in _processes_with(marker)}
    finally:
        runner.kill()
        runner.wait()
    # --die-with-parent takes it down at once; a loaded 2-core machine may take a while to reap.
    assert _wait_for(lambda: not _processes_with(marker), seconds=10), "sandbox outlived runner"
    # The killed runner left a dirty slot and its run directory: the start-up reaper cleans up.
    # (Only this runner's: the uid slots and the work root are shared by every process of the
    # host, and another test process's live sandboxes keep theirs.)
    [uid] = uids
    root = Path(config.resolved_work_root())
    left_behind = list(root.glob(f"loopwright-sbx-u{uid}-*"))
    assert left_behind
    assert sandbox_reap_stale(config) >= 1
    assert not [path for path in left_behind if path.exists()]


RUNNER_SCRIPT = """
import sys
from sandbox import SandboxRequest, run_sandboxed
run_sandboxed(SandboxRequest(language="python", code=sys.stdin.read(), timeout_seconds=60))
"""


def _wait_for(condition: Callable[[], bool], *, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# --- network ---------------------------------------------------------------------------------


@pytest.fixture
def tcp_server() -> Iterator[int]:
    """A loopback server that answers every connection with b"pong"."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.sendall(b"pong")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(timeout=2)
    server.close()


CONNECT = (
    "import socket\n"
    "try:\n"
    "    s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
    "    print(s.recv(4).decode())\n"
    "except OSError as exc:\n"
    "    print('refused', exc)\n"
)


def test_network_allowed_on_request_reaches_a_loopback_server(tcp_server: int) -> None:
    result = run_sandboxed(python(CONNECT.format(port=tcp_server), network="allow"))
    assert result.stdout.strip() == "pong", result.stderr


@pytest.mark.parametrize("mode", ["deny", "restricted"])
def test_network_denied_cannot_reach_the_same_server(tcp_server: int, mode: str) -> None:
    result = run_sandboxed(python(CONNECT.format(port=tcp_server), network=mode))
    assert result.stdout.startswith("refused")
    if mode == "restricted":
        assert any("restricted" in note for note in result.notes)


def test_node_network_allowed_on_request(tcp_server: int) -> None:
    code = (
        f"require('net').connect({tcp_server}, '127.0.0.1')"
        ".on('data', (d) => { console.log(d.toString()); process.exit(0); })"
        ".on('error', (e) => console.log('refused', e.code));"
    )
    assert run_sandboxed(node(code, network="allow")).stdout.strip() == "pong"


# --- backends --------------------------------------------------------------------------------


def test_the_probe_finds_bubblewrap_with_seccomp_on_this_host() -> None:
    probe = probe_backend(SandboxConfig.from_env())
    assert probe.bubblewrap, probe.detail
    assert probe.seccomp_error is None
    assert probe.detail.startswith("bubblewrap")


def test_without_bubblewrap_the_runner_refuses() -> None:
    with pytest.raises(SandboxUnavailable, match="LOOPWRIGHT_SANDBOX_ALLOW_RLIMIT_ONLY"):
        run_sandboxed(python("print(1)"), NO_BWRAP)


def test_rlimit_only_runs_when_the_request_opts_in() -> None:
    result = run_sandboxed(
        python("import os; print(os.getuid())", allow_rlimit_only=True), NO_BWRAP
    )
    assert result.backend == "rlimit-only"
    assert result.exit_code == 0
    assert int(result.stdout) != 0  # a dedicated uid, never root
    assert any("rlimit-only" in note for note in result.notes)


def test_rlimit_only_runs_when_the_operator_sets_the_env_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOOPWRIGHT_SANDBOX_BWRAP", "/nonexistent/bwrap")
    monkeypatch.setenv("LOOPWRIGHT_SANDBOX_ALLOW_RLIMIT_ONLY", "1")
    result = run_sandboxed(node("console.log(6 * 7)"))
    assert (result.backend, result.stdout) == ("rlimit-only", "42\n")


def test_rlimit_only_still_hides_the_parent_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"SECRET-{uuid.uuid4().hex}"
    monkeypatch.setenv("LW_CANARY_TOKEN", secret)
    result = run_sandboxed(
        python("import os; print(dict(os.environ))", allow_rlimit_only=True), NO_BWRAP
    )
    assert secret not in result.stdout and "HOME" in result.stdout


def test_rlimit_only_kills_a_detached_grandchild_at_the_timeout() -> None:
    marker = f"lw-marker-{uuid.uuid4().hex}"
    code = (
        "import os, subprocess, time\n"
        f"cmd = ['/usr/bin/python3', '-c', 'import time; time.sleep(1000)', {marker!r}]\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.execv(cmd[0], cmd)\n"
        "    os._exit(0)\n"
        "time.sleep(1000)\n"
    )
    result = run_sandboxed(python(code, timeout_seconds=2, allow_rlimit_only=True), NO_BWRAP)
    assert result.timed_out and result.duration_ms <= 3000
    assert result.leftover_processes == 0
    assert not _processes_with(marker)


def test_rlimit_only_caps_output_and_bounds_a_fork_bomb() -> None:
    bomb = (
        "import os, time\n"
        "ok = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30)\n"
        "        ok += 1\n"
        "    except OSError:\n"
        "        break\n"
        "print(ok, flush=True)\n"
        "import sys; sys.stdout.write('x' * 10_000_000)\n"
    )
    result = run_sandboxed(
        python(bomb, timeout_seconds=10, allow_rlimit_only=True, output_cap_bytes=10_000),
        NO_BWRAP,
    )
    forked = int(result.stdout.splitlines()[0])
    assert forked < SandboxLimits().max_processes
    assert result.stdout_truncated and result.killed_reason == "output_cap"
    assert result.leftover_processes == 0


def _uid_of(pid: str) -> int:
    """The real uid of a process (a sandboxed one runs as its slot's uid)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for process {pid}")


def _processes_with(needle: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and needle.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


# --- pure parts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/./b", "nul\x00"]
)
def test_input_paths_must_stay_inside_the_working_directory(path: str) -> None:
    with pytest.raises(SandboxRequestError):
        python("", files={path: b""})


@pytest.mark.parametrize("name", ["LD_PRELOAD", "NODE_OPTIONS", "1BAD", "A-B", ""])
def test_reserved_or_invalid_env_names_are_refused(name: str) -> None:
    with pytest.raises(SandboxRequestError):
        python("", env={name: "x"})


def test_limits_must_be_positive() -> None:
    with pytest.raises(SandboxRequestError):
        SandboxLimits(cpu_seconds=0)
    with pytest.raises(SandboxRequestError):
        python("", timeout_seconds=0)


def test_node_needs_room_for_v8_reservations() -> None:
    with pytest.raises(SandboxRequestError, match="address space of at least"):
        node("1", limits=SandboxLimits(address_space_bytes=512 * MiB))


def test_a_missing_interpreter_is_reported_as_unavailable() -> None:
    config = SandboxConfig(node_path="/nonexistent/node")
    with pytest.raises(SandboxUnavailable, match="node interpreter"):
        run_sandboxed(node("1"), config)


@pytest.mark.parametrize(
    ("runner_reason", "exit_code", "stderr", "want"),
    [
        ("timeout", 137, b"", "timeout"),
        ("output_cap", 137, b"MemoryError", "output_cap"),
        (None, 152, b"", "cpu"),
        (None, 153, b"", "file_size"),
        (None, 1, b"Traceback...\nMemoryError\n", "memory"),
        (None, 134, b"FATAL ERROR: Reached heap limit - JavaScript heap out of memory", "memory"),
        (None, 0, b"MemoryError", None),
        (None, 1, b"OSError: [Errno 27] File too large", "file_size"),
        (None, 1, b"ValueError", None),
    ],
)
def test_killed_reason_labels(
    runner_reason: KilledReason | None, exit_code: int, stderr: bytes, want: str | None
) -> None:
    assert killed_reason(runner_reason, exit_code, stderr) == want


def test_output_collection_never_follows_links(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"host secret")
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "a.txt").write_bytes(b"a")
    (out / "sub" / "b.bin").write_bytes(b"b" * 10)
    (out / "big").write_bytes(b"c" * 100)
    (out / "link").symlink_to(secret)
    (out / "dirlink").symlink_to(tmp_path)
    os.mkfifo(out / "fifo")
    caps = OutputCaps(pattern="*", file_bytes=50, total_bytes=1000, max_files=10)
    files, notes = outputs_collect(out, caps)
    assert [(f.name, f.data) for f in files] == [
        ("a.txt", b"a"),
        ("big", None),
        ("sub/b.bin", b"b" * 10),
    ]
    assert any("big" in note for note in notes)


def test_output_collection_honours_the_pattern_and_file_count(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"{i}.png").write_bytes(b"p")
    (tmp_path / "notes.txt").write_bytes(b"t")
    caps = OutputCaps(pattern="*.png", file_bytes=10, total_bytes=10, max_files=3)
    files, notes = outputs_collect(tmp_path, caps)
    assert [f.name for f in files] == ["0.png", "1.png", "2.png"]
    assert notes
