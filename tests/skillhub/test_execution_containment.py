"""Escape attempts through the skill execution path (request -> claim -> sandbox -> stored
result), Python and Node.js: each is contained and reported as a failed execution or as the
program's own error, and nothing outside the sandbox changes. The full S1 battery of the
sandbox itself is test_sandbox_battery.py; this checks the Skill Hub wiring around it."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import user_ensure
from skillhub.models import Skill, SkillExecution
from skillhub.services.access import Caller
from skillhub.services.executions import execution_request, execution_run

pytestmark = [
    pytest.mark.one_backend,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
]
EMPTY = {"type": "object", "properties": {}}


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    path = tmp_path / "canary.txt"
    path.write_text("host secret")
    path.chmod(0o644)
    tmp_path.chmod(0o755)
    return path


@pytest.fixture
def listener() -> Iterator[tuple[int, list[Any]]]:
    """A loopback TCP listener counting connections (must stay at zero)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted: list[Any] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


def run_code(language: str, code: str, timeout: int = 10, output_mb: int = 1) -> SkillExecution:
    skill = Skill.objects.create(
        tool_name=f"t{uuid.uuid4().hex[:12]}", title="t", code_template=code,
        language=language, input_schema=EMPTY, timeout_seconds=timeout,
        max_output_size_mb=output_mb,
    )  # fmt: skip
    user = user_ensure(username="operator", roles=[Role.OPERATOR])
    execution = execution_request(
        skill=skill, inputs={}, caller=Caller.for_user(user), origin="test"
    )
    done = execution_run(execution_id=execution.id, owner="inline-test")
    assert done is not None
    return done


PY = {
    "read": "print(open({path!r}).read())",
    "write": "open({path!r}, 'w').write('pwned')",
    "network": "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)",
    "fork": "import os\nwhile True:\n    os.fork()",
    "memory": "x = []\nwhile True:\n    x.append(bytearray(50 * 1024 * 1024))",
    "loop": "while True:\n    pass",
    "flood": "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)",
}
NODE = {
    "read": "console.log(require('fs').readFileSync({path!r}, 'utf8'))",
    "write": "require('fs').writeFileSync({path!r}, 'pwned')",
    "network": (
        "const s = require('net').connect({port}, '127.0.0.1');"
        "s.on('error', e => {{ console.error(e.message); process.exit(1); }});"
        "s.on('connect', () => process.exit(0));"
    ),
    "fork": (
        "const cp = require('child_process');"
        "for (;;) {{ try {{ cp.spawn('/usr/bin/sleep', ['60']); }} catch (e) {{}} }}"
    ),
    "memory": "const a = []; for (;;) a.push(Buffer.alloc(50 * 1024 * 1024, 1));",
    "loop": "for (;;) {{}}",
    "flood": "const c = 'x'.repeat(1 << 20); for (let i = 0; i < 100; i++) process.stdout.write(c);",
}
CASES = ["read", "write", "network", "fork", "memory", "loop", "flood"]


@pytest.mark.parametrize("language", ["python", "node"])
@pytest.mark.parametrize("case", CASES)
def test_an_escape_attempt_is_contained_and_reported(
    language: str,
    case: str,
    canary: Path,
    listener: tuple[int, list[Any]],
    make_skill: Callable[..., Skill],
) -> None:
    port, accepted = listener
    code = (PY if language == "python" else NODE)[case].format(path=str(canary), port=port)
    done = run_code(language, code, timeout=8)
    assert done.status == "failed", (done.stdout[-500:], done.stderr[-500:])
    assert done.error, "a failure must say why"
    assert "host secret" not in done.stdout
    assert canary.read_text() == "host secret"
    assert accepted == []
    if case == "loop":
        assert done.killed_reason in ("timeout", "cpu") and done.duration_ms is not None
        assert done.duration_ms <= 9_000
    if case == "flood":
        assert done.killed_reason == "output_cap" and done.stdout_truncated
        assert len(done.stdout.encode()) <= 1024 * 1024
    if case == "memory":
        assert done.killed_reason == "memory" or "memory" in done.stderr.lower()


@pytest.mark.parametrize("language", ["python", "node"])
def test_a_good_program_succeeds_and_keeps_its_output_files(language: str) -> None:
    code = {
        "python": "import os\nos.makedirs('out', exist_ok=True)\nopen('out/r.txt','w').write('ok')\nprint('done')",
        "node": "const fs=require('fs');fs.mkdirSync('out',{recursive:true});fs.writeFileSync('out/r.txt','ok');console.log('done')",
    }[language]
    done = run_code(language, code)
    assert done.status == "succeeded", done.stderr
    assert done.stdout.strip() == "done" and done.exit_code == 0
    assert done.backend == "bubblewrap"
    [file] = done.output_files.all()
    assert (file.name, bytes(file.data)) == ("r.txt", b"ok")


def test_a_second_claim_of_the_same_execution_does_nothing() -> None:
    done = run_code("python", "print(1)")
    assert execution_run(execution_id=done.id, owner="late-duplicate") is None
    assert SkillExecution.objects.get(pk=done.id).attempts == 1
