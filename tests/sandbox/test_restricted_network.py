"""``isolation.networkAccess: restricted``: real bubblewrap sandboxes behind the allowlisting
egress proxy, against a real HTTP server on loopback (``LOOPWRIGHT_OUTBOUND_PRIVATE`` allows
loopback here; the guard's other rules still apply)."""

from __future__ import annotations

import asyncio
import http.server
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import outbound
from runtime.egress_proxy import host_allowed, run_restricted
from runtime.outbound import OutboundPolicy, service_at
from runtime.tools import ToolContext, ToolResult
from runtime.tools.base import Invocation
from runtime.tools.bash import BashConfig, BashTool, bash_tool, sandbox_unavailable_reason
from sandbox import SandboxRequest, run_sandboxed


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello {self.headers.get('Host')} {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield int(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def loopback_allowed() -> Iterator[None]:
    outbound.configure(OutboundPolicy(private="allow"))
    yield
    outbound.configure(None)


@pytest.fixture
def workdir() -> Iterator[Path]:
    parent = Path(tempfile.mkdtemp(prefix="lw-egress-test-"))
    root = parent / "work"
    root.mkdir()
    yield root
    shutil.rmtree(parent)


@pytest.fixture(scope="module")
def tool() -> BashTool:
    made = bash_tool(BashConfig())
    assert made is not None, f"the sandbox must run here: {sandbox_unavailable_reason()}"
    return made


def context(workdir: Path, isolation: dict[str, Any]) -> ToolContext:
    inv = Invocation(
        run_id=uuid.uuid4(),
        role="maker",
        name="maker:0",
        employee="mia",
        harness={"isolation": isolation},
        harness_provenance={"isolation.allowedHosts": "profile:net@1"},
    )
    return ToolContext(
        workdir=str(workdir),
        idempotency_key=f"run:{uuid.uuid4()}:0",
        deadline=time.monotonic() + 60,
        invocation=inv,
    )


FETCH = (
    'python3 -c "import urllib.request, sys\n'
    "for u in sys.argv[1:]:\n"
    "    try: print('GOT', urllib.request.urlopen(u, timeout=5).read().decode())\n"
    "    except Exception as e: print('FAILED', u, e)\" {urls}"
)
DIRECT = "exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected || echo unreachable"


def bash(tool: BashTool, command: str, ctx: ToolContext) -> ToolResult:
    return asyncio.run(tool.run({"command": command}, ctx))


def test_an_allowed_host_is_reachable_and_another_is_refused(
    tool: BashTool, workdir: Path, server: int, loopback_allowed: None
) -> None:
    urls = f"http://localhost:{server}/a http://127.0.0.1:{server}/b"
    ctx = context(workdir, {"networkAccess": "restricted", "allowedHosts": ["localhost"]})
    result = bash(tool, FETCH.format(urls=urls) + "; " + DIRECT.format(port=server), ctx)
    assert f"GOT hello localhost:{server} /a" in result.content
    assert f"FAILED http://127.0.0.1:{server}/b HTTP Error 403" in result.content
    # The refusal is in the result, naming the setting; a direct connection reaches nothing.
    assert (
        "127.0.0.1 is not in isolation.allowedHosts [localhost] (set by profile:net@1)"
        in result.content
    )
    assert "unreachable" in result.content and "connected\n" not in result.content


def test_https_style_connect_tunnels_reach_only_allowed_hosts(
    tool: BashTool, workdir: Path, server: int, loopback_allowed: None
) -> None:
    tunnel = (
        'python3 -c "import socket, sys\n'
        "for host in sys.argv[1:]:\n"
        "    s = socket.create_connection(('127.0.0.1', 3128), timeout=5)\n"
        f"    s.sendall(f'CONNECT {{host}}:{server} HTTP/1.1\\r\\n\\r\\n'.encode())\n"
        "    head = s.recv(4096).decode()\n"
        "    print(host, head.split(chr(13))[0])\n"
        "    if ' 200 ' in head:\n"
        "        s.sendall(b'GET /tunnel HTTP/1.0\\r\\nHost: t\\r\\n\\r\\n')\n"
        "        reply = b''\n"
        "        while chunk := s.recv(4096):\n"
        "            reply += chunk\n"
        '        print(host, reply.decode().splitlines()[-1])" localhost 127.0.0.1'
    )
    ctx = context(workdir, {"networkAccess": "restricted", "allowedHosts": ["*.example.org", "localhost"]})  # fmt: skip
    result = bash(tool, tunnel, ctx)
    assert "localhost HTTP/1.1 200 Connection established" in result.content
    assert "localhost hello t /tunnel" in result.content
    assert "127.0.0.1 HTTP/1.1 403 Forbidden" in result.content


def test_the_outbound_guard_applies_even_to_listed_hosts(
    workdir: Path, server: int, tool: BashTool
) -> None:
    # Loopback denied by LOOPWRIGHT_OUTBOUND_PRIVATE=deny; "*" lists every host.
    outbound.configure(OutboundPolicy(private="deny"))
    try:
        ctx = context(workdir, {"networkAccess": "restricted", "allowedHosts": ["*"]})
        urls = f"http://localhost:{server}/x http://169.254.169.254/latest/meta-data"
        result = bash(tool, FETCH.format(urls=urls), ctx)
    finally:
        outbound.configure(None)
    assert "GOT" not in result.content
    assert "loopback" in result.content and "outbound guard" in result.content
    assert "169.254.169.254" in result.content


def test_the_servers_own_services_are_never_reachable(workdir: Path, server: int) -> None:
    own = OutboundPolicy(private="allow", services=(service_at("REDIS_URL", "127.0.0.1", server),))
    code = (
        "import urllib.request\n"
        f"try: urllib.request.urlopen('http://127.0.0.1:{server}/', timeout=5)\n"
        "except Exception as e: print('FAILED', e)\n"
    )
    request = SandboxRequest(language="python", code=code, network="restricted")
    result = run_restricted(request, ["127.0.0.1"], policy=own)
    assert "FAILED HTTP Error 403" in result.stdout
    assert any("REDIS_URL" in note for note in result.notes)


def test_deny_and_allow_modes_around_restricted(
    tool: BashTool, workdir: Path, server: int, loopback_allowed: None
) -> None:
    denied = bash(tool, DIRECT.format(port=server), context(workdir, {"networkAccess": "deny"}))
    assert "unreachable" in denied.content
    allowed = bash(tool, DIRECT.format(port=server), context(workdir, {"networkAccess": "allow"}))
    assert "connected" in allowed.content
    # A run without a harness snapshot gets the strictest: no network.
    ctx = context(workdir, {})
    ctx.invocation = Invocation(run_id=uuid.uuid4(), role="maker", name="m", employee="e")
    assert "unreachable" in bash(tool, DIRECT.format(port=server), ctx).content


def test_a_skill_sandbox_without_a_proxy_socket_stays_denied() -> None:
    code = (
        "import socket\n"
        "try: socket.create_connection(('127.0.0.1', 3128), timeout=2)\n"
        "except OSError: print('refused')\n"
    )

    result = run_sandboxed(SandboxRequest(language="python", code=code, network="restricted"))
    assert "refused" in result.stdout
    assert any("without an egress proxy" in note for note in result.notes)


def test_a_python_skill_behind_the_proxy(server: int) -> None:
    code = (
        "import urllib.request\n"
        f"print(urllib.request.urlopen('http://localhost:{server}/skill', timeout=5).read())\n"
    )
    request = SandboxRequest(language="python", code=code, network="restricted")
    result = run_restricted(request, ["localhost"], policy=OutboundPolicy(private="allow"))
    assert f"hello localhost:{server} /skill" in result.stdout, result.stderr
    # The forwarder dies with the program: nothing of the sandbox is left.
    assert result.leftover_processes == 0 and result.exit_code == 0


def test_a_node_skill_reaches_the_proxy_it_is_given(server: int) -> None:
    # Node's http module ignores HTTP_PROXY: a skill uses the variable itself.
    code = (
        "const http = require('http');\n"
        "const proxy = new URL(process.env.HTTP_PROXY);\n"
        f"http.get({{host: proxy.hostname, port: proxy.port, path: 'http://localhost:{server}/n'}},"
        " (res) => { let d = ''; res.on('data', (c) => d += c);"
        " res.on('end', () => console.log(res.statusCode, d)); })"
        ".on('error', (e) => console.log('err', e.message));\n"
    )
    request = SandboxRequest(language="node", code=code, network="restricted")
    result = run_restricted(request, ["localhost"], policy=OutboundPolicy(private="allow"))
    assert result.stdout.strip() == f"200 hello localhost:{server} /n", result.stderr
    assert result.leftover_processes == 0


def test_host_patterns() -> None:
    assert host_allowed("api.example.com", ["api.example.com"])
    assert host_allowed("a.example.com", ["*.example.com"])
    assert not host_allowed("example.com", ["*.example.com"])
    assert not host_allowed("evil-example.com", ["*.example.com"])
    assert host_allowed("anything.test", ["*"])
    assert not host_allowed("anything.test", [])


def test_skill_hub_takes_the_network_mode_and_hosts_from_the_harness() -> None:
    from skillhub.services.access import Caller, skill_allowed_hosts, skill_network

    def caller(isolation: dict[str, Any] | None) -> Caller:
        harness = None if isolation is None else {"isolation": isolation}
        return Caller.for_employee("mia", harness=harness, bound_tools=frozenset())

    restricted = caller({"networkAccess": "restricted", "allowedHosts": ["pypi.org"]})
    assert skill_network(restricted) == "restricted"
    assert skill_allowed_hosts(restricted) == ("pypi.org",)
    assert skill_network(caller({"networkAccess": "allow"})) == "allow"
    assert skill_network(caller({"networkAccess": "deny"})) == "deny"
    assert skill_network(caller(None)) == "deny"
    assert skill_allowed_hosts(caller({"networkAccess": "allow"})) == ()
