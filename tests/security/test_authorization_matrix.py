"""docs/reliability.md A3: the authorization matrix (BOLA/BFLA) and "no code before auth".

Every route the URL resolver knows is called — the REST API under ``/api/`` with GET, POST,
PUT, PATCH and DELETE, the UI and the Django admin with POST (and GET for the visitors without
a role) — as each persona: anonymous, outsider (no role), viewer, approver, operator, admin.
Bodies carry payloads that would create a marker file if any template, expression or code in
them were executed. The routes come from ``get_resolver()``, so a route added later is swept
without touching this file; the rights table below says who may do what, and a route it does
not name gets the safe default (any role reads; nobody below approver writes).

Pass criteria: a persona without the right gets only 401/403/404/405 (or, in the UI and the
admin, the redirect to a login page) and changes nothing in the database; a persona with the
right is not refused; no response anywhere is a 5xx; no marker file appears.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.db import connection
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from rest_framework.test import APIClient

from harness.models import HarnessProfile
from harness.services import profile_create
from loops.models import EventKey, LoopPattern, LoopRun, RunStatus
from loops.services.runs import run_act
from loops.triggers.events import event_key_create
from orchestrator.accounts.services import api_token_create, user_ensure
from orchestrator.agents.models import Employee, ModelEndpoint
from orchestrator.agents.services import employee_create, model_endpoint_create
from tests.conftest import PERSONAS
from tests.security.rights import (
    HOLDERS,
    NOBODY,
    PERSONA_ORDER,
    RIGHTS,
    VIEWER,
    WRITE,
)
from tests.support.approvals import approval_pattern, park_directly, pending_approvals, write_call

pytestmark = [pytest.mark.one_backend, pytest.mark.django_db, pytest.mark.timeout(900)]


API_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
REFUSALS = {401, 403, 404, 405}


# --- routes from the resolver ---------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    name: str  # "namespace:name", or the pattern text when unnamed
    template: str
    path: str
    area: str  # api | ui | admin | root
    #: Methods the view declares (DRF and class-based views), None when it cannot be told.
    offered: frozenset[str] | None

    def right(self, method: str) -> str:
        table = RIGHTS.get(self.name)
        if table is not None:
            return table.get(method, NOBODY)
        if self.area == "admin":
            return NOBODY  # Django's admin is for staff; no persona is staff
        if self.offered is not None and method not in self.offered:
            return NOBODY
        return VIEWER if method == "GET" else WRITE

    def methods(self, persona: str) -> tuple[str, ...]:
        if self.area in ("api", "root"):
            return API_METHODS
        # UI and admin: every form POST; pages (and live streams) only for visitors without a
        # role, who are refused before a page or a stream is produced.
        return ("GET", "POST") if persona in ("anonymous", "outsider") else ("POST",)


_NAMED_GROUP = re.compile(r"\(\?P<(\w+)>")
_CONVERTER = re.compile(r"<(?:(\w+):)?(\w+)>")


def _group_end(text: str, start: int) -> int:
    """Index just past the parenthesis that closes the group opening at ``start``."""
    depth, i = 0, start
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        depth += (char == "(") - (char == ")")
        i += 1
        if depth == 0:
            return i
    raise ValueError(f"unbalanced group in {text!r}")


def _regex_paths(text: str, value: Callable[[str], str]) -> list[str]:
    """Concrete strings for a route regex: named groups get values, alternations of literals
    expand into one string per alternative (``pause|resume|...``)."""
    text = text.removeprefix("^").removesuffix("$").removesuffix("\\Z")
    found = _NAMED_GROUP.search(text)
    if found is None:
        return [text.replace("\\", "")]
    end = _group_end(text, found.start())
    body = text[found.end() : end - 1]
    if re.fullmatch(r"[\w-]+(\|[\w-]+)+", body):
        choices = body.split("|")
    else:
        choices = [value(found.group(1))]
    rest = _regex_paths(text[end:], value)
    head = text[: found.start()].replace("\\", "")
    return [head + choice + tail for choice in choices for tail in rest]


def _piece_paths(pattern: Any, value: Callable[[str], str]) -> list[str]:
    text = str(pattern.pattern)
    if hasattr(pattern.pattern, "converters") and not text.startswith("^"):
        return [_CONVERTER.sub(lambda m: value(m.group(2)), text)]
    return _regex_paths(text, value)


def _walk(
    patterns: list[Any], prefix: list[str], namespace: str, values: Callable[[str, str], str]
) -> Iterator[tuple[str, str, str, Any]]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            inner = pattern.namespace or namespace
            for piece in _piece_paths(pattern, functools.partial(values, "")):
                yield from _walk(pattern.url_patterns, [*prefix, piece], inner, values)
        elif isinstance(pattern, URLPattern):
            name = f"{namespace}:{pattern.name}" if namespace and pattern.name else pattern.name
            label = name or str(pattern.pattern)
            for piece in _piece_paths(pattern, functools.partial(values, label)):
                yield label, str(pattern.pattern), "/" + "".join([*prefix, piece]), pattern


def offered_methods(view: Any) -> frozenset[str] | None:
    actions = getattr(view, "actions", None)  # a DRF viewset route
    if actions:
        return frozenset(m.upper() for m in actions)
    cls = getattr(view, "cls", None) or getattr(view, "view_class", None)
    if cls is None:
        return None
    names = [m for m in cls.http_method_names if m not in ("head", "options")]
    return frozenset(m.upper() for m in names if hasattr(cls, m))


def all_routes(values: Callable[[str, str], str]) -> list[Route]:
    """Every route of the project with a concrete path that resolves back to it."""
    routes, unresolvable = [], []
    for name, template, path, pattern in _walk(get_resolver().url_patterns, [], "", values):
        try:
            match = resolve(path)
        except Exception:
            match = None
        if match is None or match.func != pattern.callback:
            unresolvable.append(f"{name} -> {path}")
            continue
        area = (
            "admin" if path.startswith("/admin/")
            else "api" if path.startswith("/api/")
            else "ui" if name.startswith("ui:")
            else "root"
        )  # fmt: skip
        routes.append(Route(name, template, path, area, offered_methods(pattern.callback)))
    assert unresolvable == [], f"routes the sweep cannot address: {unresolvable}"
    return routes


# --- the objects routes point at, and payloads that would leave marks -----------------------


@dataclass
class World:
    marker_dir: Path
    run_id: str = ""
    approval_id: str = ""

    def ensure(self) -> None:
        """(Re)create what routes address, so a DELETE earlier in the sweep hides nothing."""
        if not LoopPattern.objects.filter(key="a3-probe").exists():
            approval_pattern("a3-probe", goal_template="Probe {{ inputs.get('q', '') }}")
        if not self.run_id or not LoopRun.objects.filter(pk=self.run_id).exists():
            run = park_directly(LoopPattern.objects.get(key="a3-probe"), [write_call("a.txt", "A")])
            self.run_id, self.approval_id = str(run.id), str(pending_approvals(run)[0].id)
        if not EventKey.objects.filter(key="a3-probe").exists():
            event_key_create(key="a3-probe", actor="test")
        if not HarnessProfile.objects.filter(tag="a3-probe").exists():
            profile_create(tag="a3-probe", settings={})
        endpoint = ModelEndpoint.objects.filter(name="a3-probe").first()
        if endpoint is None:
            endpoint = model_endpoint_create(name="a3-probe", provider="scripted", script="demo")
        if not Employee.objects.filter(username="a3-probe").exists():
            employee_create(username="a3-probe", endpoint=endpoint)

    def value(self, route: str, kwarg: str) -> str:
        by_kwarg = {
            "run_id": self.run_id,
            "event_key": "a3-probe",
            "tag": "a3-probe",
            "name": "a3-probe",
            "username": "a3-probe",
            "version": "1",
        }
        if kwarg == "pk":
            return self.approval_id if route.startswith("approval") else self.run_id
        if kwarg == "key":
            return "a3-probe"  # a pattern key and an event key alike
        return by_kwarg.get(kwarg, "1")

    def evil(self, tag: str) -> dict[str, str]:
        mark = str(self.marker_dir / tag)
        return {
            "jinja": "{{ cycler.__init__.__globals__.os.system('touch " + mark + "-jinja') }}",
            "lipsum": "{{ lipsum.__globals__['os'].popen('touch " + mark + "-lipsum').read() }}",
            "mro": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
            "django": "{% load os %}{{ request.META }}{% debug %}",
            "python": f"__import__('os').system('touch {mark}-python')",
            "shell": f"$(touch {mark}-shell) `touch {mark}-tick`; touch {mark}-semi",
            "node": f"require('child_process').execSync('touch {mark}-node')",
            "placeholder": "{{placeholder}} {{ inputs }}",
        }

    def payload(self, n: int) -> dict[str, Any]:
        """One body for every write route: valid enough to get past shape checks (so an allowed
        call really does its work) with an executable payload in every free-text field."""
        evil = self.evil(f"req{n}")
        code = " ".join(evil.values())
        return {
            "key": f"a3-new-{n}",
            "tag": f"a3-new-{n}",
            "name": f"a3-new-{n}",
            "username": f"a3-new-{n}",
            "title": code,
            "description": code,
            "goal_template": evil["jinja"] + evil["lipsum"] + evil["mro"],
            "leader_username": "a3-lead",
            "maker_usernames": ["a3-maker"],
            "verifier_username": "a3-verifier",
            "inputs": {
                "q": evil["jinja"],
                "code": evil["python"],
                "placeholder": "{{placeholder}}",
            },
            "event": evil,
            "decision": "approve",
            "input": {"path": "a3.txt", "content": code},
            "reason": evil["shell"],
            "settings": {"tools": {"allow": ["read"]}},
            "note": code,
            "provider": "scripted",
            "script": "demo",
            "endpoint": "a3-probe",
            "system_prompt": code,
            "tools": ["read"],
            "policy": {"approvals": {"approvers": []}},
            "code": evil["python"],
            "codeTemplate": evil["placeholder"] + evil["python"],
            "expression": evil["jinja"],
            "template": evil["jinja"],
        }


_WATCHED = ("updated_at", "rotated_at", "decided_at", "finished_at", "version")


@functools.cache
def _fingerprint_sql() -> tuple[str, tuple[str, ...]]:
    """One statement: row count and latest change of every table of the watched apps."""
    quote = connection.ops.quote_name
    parts, labels = [], []
    for label in ("loops", "harness", "agents", "auth"):
        for model in apps.get_app_config(label).get_models():
            table = quote(model._meta.db_table)
            parts.append(f"(SELECT count(*) FROM {table})")
            labels.append(f"{model._meta.label}.n")
            for field in model._meta.concrete_fields:
                if field.name in _WATCHED:
                    parts.append(f"(SELECT max({quote(field.column)}) FROM {table})")
                    labels.append(f"{model._meta.label}.{field.name}")
    return "SELECT " + ", ".join(parts), tuple(labels)


def fingerprint() -> dict[str, Any]:
    """Row counts and latest changes of every table a refused request could touch."""
    sql, labels = _fingerprint_sql()
    with connection.cursor() as cursor:
        cursor.execute(sql)
        row = cursor.fetchone()
    return dict(zip(labels, row, strict=True))


# --- the sweep -------------------------------------------------------------------------------


class Personas:
    def __init__(self) -> None:
        self.users = {p: user_ensure(username=p, roles=PERSONAS[p]) for p in PERSONAS}
        self.api: dict[str, APIClient] = {}
        self.browsers: dict[str, Client] = {}
        for persona in PERSONA_ORDER:
            client = APIClient()
            client.raise_request_exception = False
            if persona != "anonymous":
                token = api_token_create(user=self.users[persona], name="a3")
                client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
            self.api[persona] = client

    def browser(self, persona: str) -> Client:
        """The persona's logged-in browser, one per persona (a login writes a session row;
        :meth:`forget` after a route that may end the session, such as logout)."""
        client = self.browsers.get(persona)
        if client is None:
            client = Client(raise_request_exception=False)  # CSRF is not what is tested here
            if persona != "anonymous":
                client.force_login(self.users[persona])
            self.browsers[persona] = client
        return client

    def forget(self, persona: str) -> None:
        self.browsers.pop(persona, None)


def call(personas: Personas, persona: str, route: Route, method: str, body: dict[str, Any]) -> Any:
    if route.area in ("api", "root"):
        client = personas.api[persona]
        if method == "GET":
            return client.get(route.path)
        return client.generic(method, route.path, json.dumps(body), content_type="application/json")
    browser = personas.browser(persona)
    if method == "GET":
        return browser.get(route.path)
    form = {k: v if isinstance(v, str) else json.dumps(v) for k, v in body.items()}
    response = browser.post(route.path, form)
    if route.area == "admin" or "log" in (route.name or ""):  # may have ended the session
        personas.forget(persona)
    return response


def refused(route: Route, response: Any) -> bool:
    if response.status_code in REFUSALS:
        return True
    location = response.get("Location", "") if response.status_code in (301, 302) else ""
    return route.area in ("ui", "admin") and ("/login" in location)


def may(route: Route, persona: str, method: str) -> bool:
    """Whether the rights table lets ``persona`` call ``method`` on ``route`` (WRITE: only
    the personas without a role and viewers are known not to)."""
    right = route.right(method)
    if right == WRITE:
        return persona not in ("anonymous", "outsider", "viewer")
    return persona in HOLDERS[right]


def verdict(route: Route, persona: str, method: str, response: Any, changed: bool) -> str:
    """'' when the response is what the rights table allows, else what is wrong."""
    code = response.status_code
    if code >= 500:
        return f"{code} server error"
    right = route.right(method)
    if not may(route, persona, method):
        if not refused(route, response):
            return f"not refused ({code})"
        if changed:
            return f"refused ({code}) but the database changed"
        return ""
    if right != WRITE and code in (401, 403):
        return f"wrongly refused ({code})"
    return ""


def test_every_route_refuses_every_persona_without_the_right_and_executes_nothing(
    tmp_path: Path,
) -> None:
    world = World(tmp_path / "markers")
    world.marker_dir.mkdir()
    world.ensure()
    personas = Personas()
    unchanged = fingerprint()
    approval_pattern("a3-fingerprint-check")
    assert fingerprint() != unchanged, "the fingerprint would not notice a write"
    routes = all_routes(world.value)
    counter = itertools.count()
    problems: list[str] = []
    calls = 0
    for route in routes:
        for method in API_METHODS:
            world.ensure()
            for persona in PERSONA_ORDER:  # least privileged first: refusals see intact objects
                if method not in route.methods(persona):
                    continue
                # A refusal must leave the database as it was (compared only where one is due).
                before = None if may(route, persona, method) else fingerprint()
                response = call(personas, persona, route, method, world.payload(next(counter)))
                calls += 1
                changed = before is not None and fingerprint() != before
                wrong = verdict(route, persona, method, response, changed)
                if wrong:
                    problems.append(f"{method} {route.path} [{route.name}] as {persona}: {wrong}")
    unknown = sorted({r.name for r in routes if r.area != "admin" and r.name not in RIGHTS})
    print(f"\n{len(routes)} routes, {calls} calls; routes with default rights: {unknown}")
    assert calls > 1000 and {r.area for r in routes} >= {"api", "ui", "admin"}
    assert problems == [], "\n".join(problems)
    assert sorted(p.name for p in world.marker_dir.iterdir()) == []


# --- the n8n GHSA-h3jj-5f3v-3685 class, spelled out --------------------------------------------


def test_viewers_and_approvers_cannot_trigger_retry_resume_or_act_on_runs(
    api_client_for: Callable[[str], APIClient],
) -> None:
    pattern = approval_pattern("a3-actions")
    parked = park_directly(pattern, [write_call("a.txt", "A")])
    [approval] = pending_approvals(parked)
    failed = park_directly(pattern, [write_call("b.txt", "B")])
    run_act(run_id=failed.id, action="cancel", actor="operator")
    paused = park_directly(pattern, [write_call("c.txt", "C")])
    run_act(run_id=paused.id, action="pause", actor="operator")
    requests = {
        "trigger": ("/api/v1/patterns/a3-actions/trigger", {"inputs": {}}),
        "retry": (f"/api/v1/runs/{failed.id}/retry", {}),
        "resume": (f"/api/v1/runs/{paused.id}/resume", {}),
        "cancel": (f"/api/v1/runs/{parked.id}/cancel", {}),
        "decide": (f"/api/v1/approvals/{approval.id}/decide", {"decision": "approve"}),
    }
    clients = {
        p: api_client_for(p) for p in ("viewer", "approver", "outsider", "anonymous", "operator")
    }
    before = fingerprint()
    for persona in ("viewer", "approver", "outsider", "anonymous"):
        client = clients[persona]
        for action, (url, body) in requests.items():
            if persona == "approver" and action == "decide":
                continue
            response = client.post(url, body, format="json")
            assert response.status_code in (401, 403), (persona, action, response.status_code)
    assert fingerprint() == before
    statuses = dict(LoopRun.objects.values_list("id", "status"))
    assert (statuses[failed.id], statuses[paused.id], statuses[parked.id]) == (
        RunStatus.CANCELED,
        RunStatus.PAUSED,
        RunStatus.WAITING_APPROVAL,
    )
    operator = api_client_for("operator")
    assert (
        operator.post(requests["decide"][0], {"decision": "approve"}, format="json").status_code
        == 403
    )
    assert operator.post(requests["resume"][0], {}, format="json").status_code == 200
    assert operator.post(requests["retry"][0], {}, format="json").status_code == 201
    assert operator.post(requests["trigger"][0], {"inputs": {}}, format="json").status_code == 201


def test_an_unsigned_or_badly_signed_event_starts_nothing(
    api_client_for: Callable[[str], APIClient], tmp_path: Path
) -> None:
    world = World(tmp_path / "markers")
    world.marker_dir.mkdir()
    approval_pattern(
        "a3-events", trigger_type="event", event_key="a3-probe", goal_template="{{ event.q }}"
    )
    event_key_create(key="a3-probe", actor="test")
    anonymous, viewer = api_client_for("anonymous"), api_client_for("viewer")
    body = json.dumps({"q": world.evil("event")["jinja"]})
    before = fingerprint()
    attempts = [
        anonymous.generic("POST", "/api/v1/events/a3-probe", body, content_type="application/json"),
        anonymous.generic(
            "POST",
            "/api/v1/events/a3-probe",
            body,
            content_type="application/json",
            HTTP_X_LOOPWRIGHT_TIMESTAMP="0",
            HTTP_X_LOOPWRIGHT_SIGNATURE="sha256=" + "0" * 64,
        ),
        viewer.generic("POST", "/api/v1/events/a3-probe", body, content_type="application/json"),
    ]
    assert [r.status_code for r in attempts] == [401, 401, 403]
    assert fingerprint() == before
    assert list(world.marker_dir.iterdir()) == []
