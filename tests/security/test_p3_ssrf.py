"""docs/reliability.md P3 (SSRF): every request the server makes on a user's behalf goes through the
outbound guard, with the resolved address checked at connect time and after redirects.

1. A table of hostile URLs (loopback and the server's own services, unspecified, metadata
   addresses and names, decimal/octal/hex/short IPv4, IPv4-mapped, -compatible and NAT64 IPv6,
   link-local, other schemes, userinfo tricks, redirects to forbidden addresses served by a real
   loopback server, DNS names that resolve first public then private through a stub resolver),
   each with its verdict under ``LOOPWRIGHT_OUTBOUND_PRIVATE=allow`` and ``deny``. Every URL goes
   through the guard's checks and through each real client: the webhook client, and the model
   client on both transports (``http_lite`` on a pooled loop, httpx2 otherwise). Loopback
   canaries record every connection: a refused URL leaves them untouched.
2. From outside with an operator token: model endpoints at those URLs are refused (400 naming
   ``/base_url`` and the rule); an endpoint whose name rebinds after the save, or whose row was
   edited in the database, fails the run's model call with the rule and reaches nothing.
3. The approval webhook and Git import (over a real loopback Git server) refuse the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import httpx2
import pytest
from django.db import DEFAULT_DB_ALIAS, connections

from loops.models import LoopRun, RunStatus
from loops.services.claims import run_claim
from loops.services.notifications import deliver_approval_notifications
from loops.services.runs import run_trigger
from loops.worker.engine import drive_run
from loops.worker.invoker import AgentInvoker
from orchestrator import guard
from orchestrator.agents.models import ModelEndpoint
from runtime import outbound, outbound_http
from runtime.model_client import OpenAICompatibleClient
from runtime.model_config import EndpointConfig, RetryPolicy
from runtime.model_pool import close_http_pool, pool_http_connections
from runtime.outbound import OutboundPolicy, OutboundRefused, system_resolver
from runtime.tools import DirectoryLedger, FileToolConfig, builtin_registry
from runtime.types import ChatRequest, ModelCallFailed
from tests.support.approvals import (
    InlineDriver,
    approval_pattern,
    loopback_team,
    park_directly,
    pending_approvals,
    write_call,
)
from tests.support.canary import Canary, Redirector
from tests.support.git_server import GitHttpServer, git

pytestmark = [pytest.mark.one_backend]

ASK = ChatRequest(messages=[{"role": "user", "content": "hi"}])
PUBLIC = "93.184.216.34"


class StubResolver:
    """DNS of the test: ``rebind*`` names answer a public address on their first lookup (the
    save-time check) and a forbidden one afterwards (connect time); others use the system's."""

    def __init__(self) -> None:
        self.table: dict[str, list[list[str]]] = {
            "rebind.test": [[PUBLIC], ["127.0.0.1"]],
            "rebind-meta.test": [[PUBLIC], ["169.254.169.254"]],
            "rebind-v6.test": [[PUBLIC], ["::ffff:169.254.169.254"]],
            "mixed.test": [["127.0.0.1", "169.254.169.254"]],
            "git-pinned.test": [["127.0.0.1"], ["169.254.169.254"]],
        }
        self.seen: dict[str, int] = {}

    def reset(self) -> None:
        self.seen.clear()

    def __call__(self, host: str, port: int) -> list[str]:
        if host not in self.table:
            return system_resolver(host, port)
        turn = self.seen.get(host, 0)
        self.seen[host] = turn + 1
        answers = self.table[host]
        return answers[min(turn, len(answers) - 1)]


@dataclass(frozen=True)
class Case:
    url: str
    allow: str  # "fetched", "not followed" (a redirect's first hop only), or the refusing rule
    deny: str


FETCHED, NOT_FOLLOWED = "fetched", "not followed"
CASES = [
    Case("http://127.0.0.1:6379/", "service", "service"),
    Case("http://127.0.0.1:5432/", "service", "service"),
    Case("http://127.0.0.1:{s}/v1", "service", "service"),
    Case("http://localhost:{s}/v1", "service", "service"),
    Case("http://[::1]:{s}/v1", "service", "service"),
    Case("http://127.0.0.1:{c}/v1", FETCHED, "private"),
    Case("http://localhost:{c}/v1", FETCHED, "private"),
    Case("http://[::1]:{c}/v1", FETCHED, "private"),
    Case("http://0.0.0.0:{c}/v1", "never", "never"),
    Case("http://[::]:{c}/v1", "never", "never"),
    Case("http://169.254.169.254/latest/meta-data/", "metadata", "metadata"),
    Case("http://2130706433:{c}/v1", "host", "host"),
    Case("http://0177.0.0.1:{c}/v1", "host", "host"),
    Case("http://0x7f000001:{c}/v1", "host", "host"),
    Case("http://0x7f.1:{c}/v1", "host", "host"),
    Case("http://127.1:{c}/v1", "host", "host"),
    Case("http://[::ffff:127.0.0.1]:{c}/v1", FETCHED, "private"),
    Case("http://[::ffff:7f00:1]:{c}/v1", FETCHED, "private"),
    Case("http://[::ffff:169.254.169.254]/", "metadata", "metadata"),
    Case("http://[::169.254.169.254]/", "metadata", "metadata"),
    Case("http://[64:ff9b::a9fe:a9fe]/", "metadata", "metadata"),
    Case("file:///etc/passwd", "scheme", "scheme"),
    Case("gopher://127.0.0.1:{c}/_GET%20/", "scheme", "scheme"),
    Case("ftp://127.0.0.1:{c}/", "scheme", "scheme"),
    Case("dict://127.0.0.1:{c}/info", "scheme", "scheme"),
    Case("http://good@169.254.169.254/", "url", "url"),
    Case("http://good@127.0.0.1:{c}/v1", "url", "url"),
    Case("http://[fe80::1]:{c}/", "never", "never"),
    Case("http://[fe80::1%25lo]:{c}/", "host", "host"),
    Case("http://100.100.100.200/latest/meta-data/", "metadata", "metadata"),
    Case("http://metadata.google.internal/computeMetadata/v1/", "metadata", "metadata"),
    Case("http://METADATA.GOOGLE.INTERNAL./", "metadata", "metadata"),
    Case("http://[fd00:ec2::254]/", "metadata", "metadata"),
    Case("http://255.255.255.255/", "never", "never"),
    Case("http://224.0.0.1/", "never", "never"),
    Case("http://240.0.0.1/", "never", "never"),
    Case("http://127.0.0.1:{r1}/v1", NOT_FOLLOWED, "private"),  # 302 to 2130706433:{c}
    Case("http://127.0.0.1:{r2}/v1", NOT_FOLLOWED, "private"),  # 302 to 169.254.169.254
    Case("http://rebind.test:{c}/v1", FETCHED, "private"),
    Case("http://rebind-meta.test:{c}/v1", "metadata", "metadata"),
    Case("http://rebind-v6.test:{c}/v1", "metadata", "metadata"),
    Case("http://mixed.test:{c}/v1", "metadata", "metadata"),
    Case("http://127.0.0.1:{c}\\@example.com/v1", "url", "url"),
]


def outside_cases(*verdicts: str) -> list[Case]:
    """Cases for the process-wide policy: not the literal 6379/5432 ones (the server's own
    services only when its settings say so; ``own_services`` lists those) nor the stub's names."""
    return [
        c for c in CASES
        if ":6379" not in c.url and ":5432" not in c.url
        and not c.url.startswith(("http://rebind", "http://mixed"))
        and (not verdicts or c.allow in verdicts)
    ]  # fmt: skip


REFUSED = tuple({c.allow for c in CASES} - {FETCHED, NOT_FOLLOWED})


def own_services(settings: Any, service_port: int) -> list[str]:
    """Point REDIS_URL at a canary (one more backing service); the URLs of every backing
    service the settings name."""
    settings.REDIS_URL = f"redis://127.0.0.1:{service_port}/0"
    own = [f"http://127.0.0.1:{service_port}/v1"]
    db = settings.DATABASES["default"]
    if "postgresql" in db["ENGINE"]:
        own.append(f"http://{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/v1")
    broker = outbound.service("CELERY_BROKER_URL", settings.CELERY_BROKER_URL)
    if broker is not None:
        own.append(f"http://{broker.host}:{broker.port}/v1")
    return own


@dataclass
class World:
    canary: Canary
    service: Canary  # registered as one of the server's own services
    redirects: tuple[Redirector, Redirector]
    resolver: StubResolver

    def url(self, case: Case) -> str:
        r1, r2 = self.redirects
        return case.url.format(c=self.canary.port, s=self.service.port, r1=r1.port, r2=r2.port)

    def policy(self, mode: str) -> OutboundPolicy:
        services = tuple(
            outbound.service_at(label, "127.0.0.1", port)
            for label, port in (("REDIS_URL", 6379), ("DATABASE_URL", 5432),
                                ("CANARY_SERVICE", self.service.port))
        )  # fmt: skip
        return OutboundPolicy(private=mode, services=services, resolver=self.resolver)  # type: ignore[arg-type]

    def hits(self) -> tuple[int, int, int]:
        return self.canary.hits(), self.service.hits(), sum(r.hits() for r in self.redirects)


@pytest.fixture
def world() -> Iterator[World]:
    with Canary() as canary, Canary() as service, Redirector() as r1, Redirector() as r2:
        r1.location = f"http://2130706433:{canary.port}/v1/chat/completions"
        r2.location = "http://169.254.169.254/latest/meta-data/"
        yield World(canary, service, (r1, r2), StubResolver())


def verdict(url: str, policy: OutboundPolicy, resolver: StubResolver) -> str:
    """The guard's own verdict: the save-time check, then the connect-time resolution."""
    resolver.reset()
    try:
        target = outbound.check_url_now(url, policy)
        outbound.resolve_checked(target.host, target.port, policy)
    except OutboundRefused as exc:
        return exc.rule
    return FETCHED


def webhook(url: str, policy: OutboundPolicy) -> None:
    with contextlib.suppress(OutboundRefused, httpx2.HTTPError, OSError):
        outbound_http.post_json(url, {"text": "p3"}, policy=policy, timeout=5)


async def model_call(url: str, policy: OutboundPolicy, *, pooled: bool) -> None:
    config = EndpointConfig(name="p3", base_url=url, model="m", max_retries=0, timeout_seconds=5)
    client = OpenAICompatibleClient(
        config, outbound=policy, retry=RetryPolicy(base_delay=0, max_delay=0)
    )
    if pooled:
        pool_http_connections(asyncio.get_running_loop())  # the run driver's path: http_lite
    try:
        await client.complete(ASK)
    except ModelCallFailed:
        pass
    finally:
        if pooled:
            await close_http_pool()


def through_every_client(world: World, url: str, policy: OutboundPolicy) -> list[str]:
    """Each real client in turn (after a save-time check that takes the stub's first answer);
    what each one reached: "fetched", "not followed" (only a redirect's first hop) or
    "nothing"."""
    reached = []
    clients = [
        lambda: webhook(url, policy),
        lambda: asyncio.run(model_call(url, policy, pooled=True)),
        lambda: asyncio.run(model_call(url, policy, pooled=False)),
    ]
    for call in clients:
        world.resolver.reset()
        with contextlib.suppress(OutboundRefused):  # the clients must refuse on their own too
            outbound.check_url_now(url, policy)
        before = world.hits()
        call()
        canary, service, redirect = (a - b for a, b in zip(world.hits(), before, strict=True))
        assert service == 0, f"{url}: the server's own service was reached"
        if canary:
            reached.append(FETCHED)
        elif redirect:
            reached.append(NOT_FOLLOWED)
        else:
            reached.append("nothing")
    return reached


def test_the_table_has_at_least_30_hostile_urls() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize("mode", ["allow", "deny"])
def test_each_hostile_url_gets_its_verdict_and_nothing_refused_is_fetched(
    world: World, mode: str
) -> None:
    policy = world.policy(mode)
    wrong = []
    for case in CASES:
        url = world.url(case)
        expected = getattr(case, mode)
        guard_says = verdict(url, policy, world.resolver)
        if guard_says != (FETCHED if expected == NOT_FOLLOWED else expected):
            wrong.append(f"{url}: the guard says {guard_says}, expected {expected}")
            continue
        clients = through_every_client(world, url, policy)
        fetched = expected if expected in (FETCHED, NOT_FOLLOWED) else "nothing"
        if clients != [fetched] * 3:
            wrong.append(f"{url}: webhook, model (http_lite), model (httpx) reached {clients}")
    assert not wrong, "\n".join(wrong)
    # Nothing followed a redirect: the numeric-form target behind r1 is the canary itself.
    assert not any("2130706433" in p for p in world.canary.requests)


# --- from outside: the REST API, a real run, the webhook, Git import ---------------------------


@pytest.fixture
def stubbed_dns(world: World) -> Iterator[StubResolver]:
    """The process-wide policy (settings' private mode and services) with the stub resolver."""
    policy = guard.policy_from_settings()
    outbound.configure(
        OutboundPolicy(private=policy.private, services=policy.services, resolver=world.resolver)
    )
    yield world.resolver
    guard.apply()


def create_endpoint(client: Any, base_url: str, name: str = "p3") -> Any:
    body = {"name": name, "provider": "openai", "base_url": base_url, "model": "m"}
    return client.post("/api/v1/model-endpoints", body, format="json")


@pytest.mark.django_db
def test_model_endpoints_at_hostile_urls_are_refused_through_the_api(
    world: World, api_client_for: Any, settings: Any
) -> None:
    operator = api_client_for("operator")
    own = own_services(settings, world.service.port)
    for url in [*own, *(world.url(c) for c in outside_cases(*REFUSED))]:
        response = create_endpoint(operator, url)
        assert response.status_code == 400, (url, response.content)
        problem = response.json()
        assert response["Content-Type"] == "application/problem+json"
        assert [e["pointer"] for e in problem["errors"]] == ["/base_url"], url
        assert "outbound guard" in problem["detail"], problem
    assert not ModelEndpoint.objects.exists()
    settings.LOOPWRIGHT_OUTBOUND = {**settings.LOOPWRIGHT_OUTBOUND, "PRIVATE": "deny"}
    for host in ("127.0.0.1", "localhost", "[::1]", "[::ffff:127.0.0.1]"):
        response = create_endpoint(operator, f"http://{host}:{world.canary.port}/v1")
        assert response.status_code == 400
        assert "LOOPWRIGHT_OUTBOUND_PRIVATE=deny refuses" in response.json()["detail"]
    assert world.hits() == (0, 0, 0)


@pytest.mark.django_db
def test_a_name_that_resolves_to_a_forbidden_address_now_is_refused_at_save(
    world: World, api_client_for: Any, stubbed_dns: StubResolver
) -> None:
    response = create_endpoint(api_client_for("operator"), "http://mixed.test:8080/v1")
    assert response.status_code == 400
    assert "mixed.test (169.254.169.254) is a cloud metadata address" in response.json()["detail"]


def drive(run_id: uuid.UUID, tmp_path: Path) -> LoopRun:
    invoker = AgentInvoker(tools=builtin_registry(FileToolConfig(ledger=DirectoryLedger(tmp_path))))
    [claim] = run_claim(owner="p3-engine", lease_seconds=300, run_id=run_id)
    outer = connections[DEFAULT_DB_ALIAS]

    async def main() -> None:
        connections[DEFAULT_DB_ALIAS] = outer
        await drive_run(InlineDriver(invoker), claim)  # type: ignore[arg-type]

    with mock.patch.dict(os.environ, {"DJANGO_ALLOW_ASYNC_UNSAFE": "true"}):
        asyncio.run(main())
    return LoopRun.objects.get(pk=run_id)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("seeded_profiles")
@pytest.mark.parametrize("how", ["rebinding", "row edited in the database"])
def test_a_run_whose_endpoint_turns_hostile_fails_with_the_rule_and_reaches_nothing(
    world: World, api_client_for: Any, settings: Any, stubbed_dns: StubResolver,
    tmp_path: Path, how: str,
) -> None:  # fmt: skip
    settings.LOOPWRIGHT_OUTBOUND = {**settings.LOOPWRIGHT_OUTBOUND, "PRIVATE": "deny"}
    outbound.configure(OutboundPolicy(private="deny", resolver=stubbed_dns))
    base_url = f"http://rebind.test:{world.canary.port}/v1"
    stubbed_dns.reset()
    response = create_endpoint(api_client_for("operator"), base_url, name="p3-rest")
    assert response.status_code == 201, response.content  # the name was public when saved
    stubbed_dns.reset()
    loopback_team(base_url, "p3")  # the team's own endpoint, saved the same way
    if how != "rebinding":
        ModelEndpoint.objects.update(base_url="http://169.254.169.254/v1")
    pattern = approval_pattern("p3-ssrf")
    run = drive(run_trigger(pattern=pattern, actor="operator", inputs={}).id, tmp_path)
    assert run.status == RunStatus.FAILED, run.failure_reason
    rule = "is a loopback address" if how == "rebinding" else "is a cloud metadata address"
    assert rule in run.failure_reason and "outbound guard" in run.failure_reason
    assert world.hits() == (0, 0, 0)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("seeded_profiles")
def test_the_approval_webhook_refuses_hostile_urls(
    world: World, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    loopback_team(world.canary.url(), "p3-hook")
    [approval] = pending_approvals(
        park_directly(approval_pattern("p3-hook"), [write_call("a", "b")])
    )
    own = own_services(settings, world.service.port)
    hostile = [*own, *(world.url(c) for c in outside_cases(*REFUSED, NOT_FOLLOWED))]
    for url in hostile:
        settings.LOOPWRIGHT = {**settings.LOOPWRIGHT, "APPROVAL_WEBHOOK_URL": url}
        with caplog.at_level(logging.WARNING, "loops.services.notifications"):
            deliver_approval_notifications([str(approval.id)])
    assert world.canary.hits() == 0 and world.service.hits() == 0
    assert "approval webhook refused" in caplog.text and "outbound guard" in caplog.text
    settings.LOOPWRIGHT = {**settings.LOOPWRIGHT, "APPROVAL_WEBHOOK_URL": world.canary.url("/h")}
    deliver_approval_notifications([str(approval.id)])
    assert world.canary.requests == ["/h"]  # the guard lets an allowed one through


@pytest.fixture
def git_server(tmp_path: Path, settings: Any) -> Iterator[tuple[GitHttpServer, str]]:
    settings.LOOPWRIGHT_OUTBOUND = {
        **settings.LOOPWRIGHT_OUTBOUND, "GIT_SCHEMES": frozenset({"http", "https"})
    }  # fmt: skip
    work = tmp_path / "work"
    (work / "skills" / "s").mkdir(parents=True)
    (work / "skills.json").write_text('{"skills": [{"path": "skills/s"}]}')
    (work / "skills" / "s" / "SKILL.md").write_text("---\ntoolName: s\n---\nHi\n")
    (work / "skills" / "s" / "main.py").write_text("print(1)\n")
    git(work, "init", "--quiet", "-b", "main")
    git(work, "add", ".")
    git(work, "commit", "--quiet", "-m", "one skill")
    (tmp_path / "served").mkdir()
    with GitHttpServer(tmp_path / "served") as server:
        yield server, server.publish(work, "skills")


def git_list(client: Any, url: str) -> Any:
    return client.post("/api/v1/skills/gitListSkills", {"repository": url}, format="json")


@pytest.mark.django_db
def test_git_import_refuses_hostile_urls_and_redirects(
    world: World, git_server: tuple[GitHttpServer, str], api_client_for: Any, settings: Any
) -> None:
    server, url = git_server
    operator = api_client_for("operator")
    own = own_services(settings, world.service.port)
    hostile = [*own, *(world.url(c) for c in outside_cases(*REFUSED))]
    for repository in (u.replace("/v1", "/x.git") for u in hostile):
        response = git_list(operator, repository)
        assert response.status_code == 400, (repository, response.content)
        assert response.json()["errors"][0]["pointer"] == "/repository"
    server.redirects["/skills.git/info/refs"] = world.canary.url("/skills.git/info/refs")
    response = git_list(operator, url)
    assert response.status_code == 400 and "git clone failed" in response.json()["detail"]
    settings.LOOPWRIGHT_OUTBOUND = {**settings.LOOPWRIGHT_OUTBOUND, "PRIVATE": "deny"}
    response = git_list(operator, url)
    assert (
        response.status_code == 400
        and "LOOPWRIGHT_OUTBOUND_PRIVATE=deny" in response.json()["detail"]
    )
    assert world.hits() == (0, 0, 0)
    assert [p for p in server.requests if "info/refs" in p] == [
        "/skills.git/info/refs?service=git-upload-pack"
    ]


@pytest.mark.django_db
def test_git_connects_only_to_the_address_the_guard_checked(
    git_server: tuple[GitHttpServer, str], api_client_for: Any, stubbed_dns: StubResolver
) -> None:
    """``git-pinned.test`` exists only in the stub resolver (127.0.0.1 first, a metadata
    address afterwards): the clone works only because git used the pinned, checked address."""
    _, url = git_server
    stubbed_dns.reset()
    pinned = url.replace("127.0.0.1", "git-pinned.test")
    response = git_list(api_client_for("operator"), pinned)
    assert response.status_code == 200, response.content
    assert [s["tool_name"] for s in response.json()["skills"]] == ["s"]
    assert stubbed_dns.seen["git-pinned.test"] == 1
