"""A skill execution's network is the calling role's harness: ``restricted`` runs behind the
allowlisting egress proxy with the caller's ``isolation.allowedHosts``, through the whole Skill
Hub path (request -> claim -> sandbox -> stored result), against a real HTTP server on loopback
(the outbound guard allows loopback here; its other rules still apply)."""

from __future__ import annotations

import http.server
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from runtime import outbound
from runtime.outbound import OutboundPolicy
from skillhub.models import Skill, SkillExecution
from skillhub.services.access import Caller
from skillhub.services.executions import execution_request, execution_run

# transaction=True: the execution watcher writes its events on its own connection.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    outbound.configure(OutboundPolicy(private="allow"))
    yield int(httpd.server_address[1])
    outbound.configure(None)
    httpd.shutdown()
    httpd.server_close()


def fetch(port: int, host: str, isolation: dict[str, Any]) -> SkillExecution:
    code = (
        "import urllib.request\n"
        "try:\n"
        f"    print(urllib.request.urlopen('http://{host}:{port}/skill', timeout=5).read())\n"
        "except Exception as exc:\n"
        "    print('refused:', exc)\n"
    )
    skill = Skill.objects.create(
        tool_name=f"t{uuid.uuid4().hex[:12]}", title="t", code_template=code, language="python",
        input_schema={"type": "object", "properties": {}}, timeout_seconds=20,
    )  # fmt: skip
    harness = {
        "tools": {
            "allow": ["*"],
            "ask": [],
            "deny": [],
            "effects": {},
            "trustedPreHandlerTools": [],
        },
        "isolation": isolation,
    }
    caller = Caller.for_employee("mia", harness=harness, bound_tools=frozenset())
    execution = execution_request(skill=skill, inputs={}, caller=caller, origin="test")
    done = execution_run(execution_id=execution.id, owner="inline-test")
    assert done is not None
    return done


def test_a_restricted_skill_reaches_only_the_hosts_its_harness_names(server: int) -> None:
    restricted = {"networkAccess": "restricted", "allowedHosts": ["localhost"]}
    allowed = fetch(server, "localhost", restricted)
    assert (allowed.network, allowed.allowed_hosts) == ("restricted", ["localhost"])
    assert "hello /skill" in allowed.stdout, (allowed.stdout, allowed.stderr)
    other = fetch(server, "127.0.0.1", restricted)  # a host the list does not name
    assert "hello" not in other.stdout and "refused:" in other.stdout, other.stdout


def test_a_denied_skill_reaches_nothing(server: int) -> None:
    denied = fetch(server, "localhost", {"networkAccess": "deny", "allowedHosts": ["localhost"]})
    assert denied.network == "deny"
    assert "hello" not in denied.stdout and "refused:" in denied.stdout, denied.stdout
