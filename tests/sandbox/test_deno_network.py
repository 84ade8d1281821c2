"""Deno skills and the network: the same rule as Python and Node.js (deny by default; ``allow``
the host network; ``restricted`` only through the allowlisting egress proxy), with Deno's
``--allow-net`` as a second wall, against a real HTTP server on loopback. Where Deno's wall
refuses first, the same program is also run with Deno's wall opened (a test-only interpreter,
tests/skillhub/battery_deno.py) to show bubblewrap's namespace and the proxy holding alone."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from runtime.egress_proxy import run_restricted
from runtime.outbound import OutboundPolicy
from sandbox import SandboxConfig, SandboxRequest, run_sandboxed
from sandbox.denoargs import deno_net_flags
from tests.skillhub.battery_deno import open_deno_config

LOOPBACK = OutboundPolicy(private="allow")


class _DenoHello(http.server.BaseHTTPRequestHandler):
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
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DenoHello)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield int(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def open_config() -> Iterator[SandboxConfig]:
    with open_deno_config(SandboxConfig.from_env()) as config:
        yield config


def fetch_code(url: str) -> str:
    return (
        "try {\n"
        f"  const res = await fetch({url!r});\n"
        "  console.log('STATUS', res.status, await res.text());\n"
        "} catch (e) { console.log('FETCH-ERROR', (e as Error).name, (e as Error).message); }\n"
    )


def connect_code(port: int) -> str:
    return (
        "try {\n"
        f"  const conn = await Deno.connect({{ hostname: '127.0.0.1', port: {port} }});\n"
        "  console.log('CONNECTED'); conn.close();\n"
        "} catch (e) { console.log('CONNECT-ERROR', (e as Error).name); }\n"
    )


def test_a_deno_skill_fetches_an_allowed_host_through_the_proxy(server: int) -> None:
    """Deno's fetch honours HTTP_PROXY: no code of the skill's own is needed."""
    request = SandboxRequest(
        language="deno", code=fetch_code(f"http://localhost:{server}/d"), network="restricted"
    )
    result = run_restricted(request, ["localhost"], policy=LOOPBACK)
    assert result.stdout.strip() == f"STATUS 200 hello localhost:{server} /d", result.stderr
    assert result.exit_code == 0 and result.leftover_processes == 0


def test_restricted_deno_is_refused_other_hosts_by_both_walls(
    server: int, open_config: SandboxConfig
) -> None:
    code = fetch_code(f"http://127.0.0.1:{server}/x") + connect_code(server)
    request = SandboxRequest(language="deno", code=code, network="restricted")
    walled = run_restricted(request, ["localhost"], policy=LOOPBACK)
    # Deno's wall: neither host is in its --allow-net.
    assert walled.stdout.count("NotCapable") == 2, walled.stdout + walled.stderr
    opened = run_restricted(request, ["localhost"], config=open_config, policy=LOOPBACK)
    # bubblewrap's namespace and the proxy: the proxy refuses the host, nothing else is there.
    assert "NotCapable" not in opened.stdout, opened.stdout
    assert "STATUS 200" not in opened.stdout and "CONNECTED" not in opened.stdout
    assert "CONNECT-ERROR ConnectionRefused" in opened.stdout, opened.stdout
    assert any("127.0.0.1" in note and "refused" in note for note in opened.notes), opened.notes


def test_denied_deno_reaches_nothing_behind_either_wall(
    server: int, open_config: SandboxConfig
) -> None:
    code = fetch_code(f"http://127.0.0.1:{server}/x") + connect_code(server)
    request = SandboxRequest(language="deno", code=code)
    walled = run_sandboxed(request)
    assert walled.stdout.count("NotCapable") == 2, walled.stdout + walled.stderr
    opened = run_sandboxed(request, open_config)
    assert "NotCapable" not in opened.stdout and "STATUS" not in opened.stdout
    assert "CONNECT-ERROR ConnectionRefused" in opened.stdout, opened.stdout


def test_a_deno_skill_with_network_allow_uses_the_host_network(server: int) -> None:
    code = fetch_code(f"http://127.0.0.1:{server}/a")
    result = run_sandboxed(SandboxRequest(language="deno", code=code, network="allow"))
    assert result.stdout.strip() == f"STATUS 200 hello 127.0.0.1:{server} /a", result.stderr


def test_deno_net_flags_follow_the_network_mode() -> None:
    assert deno_net_flags("deny", False, ["*"]) == []
    assert deno_net_flags("restricted", False, ["a.test"]) == []  # no proxy: denied
    assert deno_net_flags("allow", False, []) == ["--allow-net"]
    assert deno_net_flags("restricted", True, ["*"]) == ["--allow-net"]
    hosts = ["API.example.com.", "*.example.org", "bad,host", "[::1]", "a.test:8443"]
    assert deno_net_flags("restricted", True, hosts) == [
        "--allow-net=127.0.0.1:3128,api.example.com,*.example.org,a.test:8443"
    ]
