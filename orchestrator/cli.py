"""``loopwright``: trigger a pattern and follow its run from a terminal.

    loopwright trigger <pattern> [--input key=value ...] [--override section.key=value ...]
                                 [--overrides-json '{...}'] [--watch]
    loopwright watch <run-id>
    loopwright approvals [--run <run-id>]
    loopwright approve <approval-id> [--reason TEXT]
    loopwright reject <approval-id> [--reason TEXT]

``--override`` and ``--overrides-json`` give the run's own harness layer (docs/harness.md): it
can only tighten. What it asks for beyond an earlier layer is not applied; the CLI prints each
such setting with the value the run got and the layer that set it.

It talks to the REST API only (no Django import, so it starts fast and runs anywhere):
``LOOPWRIGHT_URL`` (default http://127.0.0.1:8000) and ``LOOPWRIGHT_TOKEN`` (a bearer API token,
see ``manage.py create_api_token``). Exit codes: 0 the run succeeded (or was triggered without
``--watch``), 1 an error (configuration, network, the API refused), 2 the run ended otherwise or
is parked waiting for a human, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TextIO
from urllib.parse import quote

import httpx2

if __package__:
    from orchestrator.cli_output import (
        _clock,
        _short,
        approval_commands,
        money,
        sse_messages,
        step_line,
    )
else:  # a bare file (bin/loopwright, python -P): its helper is in its folder, not on the path
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    from cli_output import (  # type: ignore[no-redef]
        _clock,
        _short,
        approval_commands,
        money,
        sse_messages,
        step_line,
    )

DEFAULT_URL = "http://127.0.0.1:8000"
#: The pause before reconnecting to a stream that dropped.
POLL_SECONDS = 0.5
#: A stream sends a heartbeat every 15 s: a read waiting longer has lost its server.
STREAM_TIMEOUT = httpx2.Timeout(10.0, read=45.0)
OPEN_STEPS = {"started", "gated", "approved"}
TERMINAL = {"succeeded", "failed", "canceled"}
#: Parked states: the run holds no worker and waits for a person.
PARKED = {"waiting_approval", "waiting_human", "paused", "blocked"}
EXIT_OK, EXIT_ERROR, EXIT_NOT_SUCCEEDED, EXIT_INTERRUPTED = 0, 1, 2, 130
#: Consecutive failed connections tolerated while watching (a restarting server), ~15 s.
MAX_POLL_FAILURES = 30


class CliError(Exception):
    """Something to tell the user, then exit 1. ``transient``: worth retrying (network, 5xx);
    ``status``: the HTTP status of the API's refusal, if that is what it is."""

    def __init__(self, message: str, *, transient: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status


# --- API access ----------------------------------------------------------------------------------


def _problem_text(response: httpx2.Response) -> str:
    """A problem+json body as 'title: detail' plus one line per field error."""
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:300]}"
    if not isinstance(body, dict):
        return f"HTTP {response.status_code}: {str(body)[:300]}"
    title = body.get("title") or f"HTTP {response.status_code}"
    lines = [f"{title}: {body.get('detail', '')}".rstrip(": ")]
    for error in body.get("errors") or []:
        if isinstance(error, dict):
            where = str(error.get("pointer") or "").lstrip("/").replace("/", ".") or "body"
            lines.append(f"  {where}: {error.get('detail', '')}")
    return "\n".join(lines)


@dataclass
class Api:
    """A thin client of the Loopwright REST API."""

    url: str
    token: str
    client: httpx2.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = httpx2.Client(
            base_url=self.url.rstrip("/"),
            headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"},
            timeout=httpx2.Timeout(10.0),
        )

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.client.request(method, f"/api/v1/{path}", **kwargs)
        except httpx2.TransportError as exc:
            raise CliError(
                f"Cannot reach Loopwright at {self.url} (LOOPWRIGHT_URL): {exc}", transient=True
            ) from exc
        if response.status_code >= 400:
            raise CliError(
                _problem_text(response),
                transient=response.status_code >= 500,
                status=response.status_code,
            )
        return response.json()

    def lines(self, path: str, headers: dict[str, str], params: dict[str, Any]) -> Iterator[str]:
        """The lines of a streamed answer (server-sent events); a refusal raises CliError."""
        try:
            with self.client.stream(
                "GET", f"/api/v1/{path}", headers=headers, params=params, timeout=STREAM_TIMEOUT
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise CliError(
                        _problem_text(response),
                        transient=response.status_code >= 500,
                        status=response.status_code,
                    )
                yield from response.iter_lines()
        except httpx2.ConnectError as exc:
            raise CliError(
                f"Cannot reach Loopwright at {self.url} (LOOPWRIGHT_URL): {exc}", transient=True
            ) from exc
        except httpx2.TransportError as exc:
            raise CliError(f"Lost the stream from {self.url}: {exc}", transient=True) from exc

    def close(self) -> None:
        self.client.close()


def api_from_env(environ: dict[str, str] | None = None) -> Api:
    env = os.environ if environ is None else environ
    token = env.get("LOOPWRIGHT_TOKEN", "").strip()
    if not token:
        raise CliError(
            "LOOPWRIGHT_TOKEN is not set: export LOOPWRIGHT_TOKEN=<API token> "
            "(create one with `manage.py create_api_token <username> --role operator`)."
        )
    return Api(url=env.get("LOOPWRIGHT_URL", "").strip() or DEFAULT_URL, token=token)


# --- inputs --------------------------------------------------------------------------------------


def parse_inputs(pairs: Sequence[str]) -> dict[str, Any]:
    """``key=value`` pairs; a value that is valid JSON is taken as JSON, else as a string."""
    inputs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--input {pair!r}: expected key=value.")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        inputs[key.strip()] = value
    return inputs


def parse_overrides(pairs: Sequence[str], raw_json: str | None = None) -> dict[str, Any] | None:
    """The run's harness overrides: ``--overrides-json`` (an object), then each ``--override
    section.key=value`` on top (the value is JSON when it parses, else a string). None: none."""
    overrides: dict[str, Any] = {}
    if raw_json is not None:
        try:
            parsed = json.loads(raw_json)
        except ValueError as exc:
            raise CliError(f"--overrides-json: not valid JSON ({exc}).") from exc
        if not isinstance(parsed, dict):
            raise CliError('--overrides-json: expected a JSON object such as {"limits": {...}}.')
        overrides = parsed
    for pair in pairs:
        field_path, sep, raw = pair.partition("=")
        section, dot, key = field_path.strip().partition(".")
        if not sep or not dot or not section or not key or "." in key:
            raise CliError(
                f"--override {pair!r}: expected section.key=value, e.g. limits.maxInvocations=3."
            )
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        target = overrides.setdefault(section, {})
        if not isinstance(target, dict):
            raise CliError(f"--override {pair!r}: {section} is not an object in --overrides-json.")
        target[key] = value
    return overrides if raw_json is not None or pairs else None


def notice_lines(notices: Sequence[dict[str, Any]]) -> list[str]:
    """One line per override that was not applied: who, the setting, what it got and why."""
    lines = []
    for notice in notices:
        lines.append(
            f"  not applied for {notice.get('role')} {notice.get('employee')}: "
            f"{notice.get('field')} = {_short(notice.get('got'))} "
            f"(asked {_short(notice.get('asked'))}; set by {notice.get('decidedBy')})"
        )
    return lines


# --- watching ------------------------------------------------------------------------------------


def format_event(event: dict[str, Any]) -> str:
    """One line: time, type, from→to, actor, and a few data items (for an event that starts
    or ends a wait, what it waits on or how long it waited, instead of the items)."""
    moved = ""
    if event.get("to_status") and event.get("to_status") != event.get("from_status"):
        moved = f"{event.get('from_status') or '·'}→{event['to_status']}"
    data = event.get("data") or {}
    items = _wait_line(str(event.get("type") or ""), data) or " ".join(
        f"{k}={_short(v)}" for k, v in list(data.items())[:4] if v not in ("", None)
    )
    actor = f"by {event['actor']}" if event.get("actor") else ""
    parts = [_clock(event.get("created_at")), f"#{event.get('seq')}", event.get("type", "?")]
    return "  ".join(p for p in [*parts, moved, actor, items] if p)


#: What ended a wait, by the event type that ended it (``wait.ended``'s ``ended_by``). The CLI
#: runs as a bare file importing nothing of the project, so these words repeat the run page's
#: (frontend/templatetags/waits.py); tests/ui/test_waits_shown.py holds both to the same lines.
_WAIT_ENDED_BY = {
    "run.started": "locks taken",
    "lock.timeout": "timed out",
    "run.canceled": "canceled",
    "run.paused": "paused",
    "model.answered": "the model answered",
    "run.failed": "the run failed",
}


def _wait_duration(seconds: float) -> str:
    """``42.5 s``, ``4m 02s``, ``1h 05m``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def _wait_line(kind: str, data: dict[str, Any]) -> str:
    """The one line of an event that starts a wait (``lock.waiting``, a model's
    ``run.retry_later``) or ends it (``wait.ended``); empty for any other event."""
    if kind == "lock.waiting":
        wanted = list(data.get("paths") or [])
        paths = ", ".join(wanted) or "?"
        holders = [str(r)[:8] for r in data.get("held_by") or []]
        held = f" held by run{'s' if len(holders) > 1 else ''} {', '.join(holders)}"
        locks = "locks" if len(wanted) > 1 else "lock"
        return f"waiting for path {locks} on {paths}{held if holders else ''}"
    if kind == "run.retry_later" and data.get("kind") == "model":
        error = f" (last error: {_short(data['error'])})" if data.get("error") else ""
        return f"waiting for model endpoint {data.get('endpoint') or '?'}{error}"
    if kind == "wait.ended":
        polls = int(data.get("polls") or 0)
        by = str(data.get("ended_by") or "")
        text = (
            f"waited {_wait_duration(float(data.get('waited_seconds') or 0))}, "
            f"{polls} poll{'' if polls == 1 else 's'}, "
            f"longest gap {float(data.get('longest_gap_seconds') or 0):.1f} s"
        )
        return f"{text} ({_WAIT_ENDED_BY.get(by, by)})" if by else text
    return ""


def _duration(run: dict[str, Any]) -> str:
    start = run.get("started_at") or run.get("created_at")
    end = run.get("finished_at") or run.get("updated_at")
    if not start or not end:
        return "-"
    seconds = (
        datetime.fromisoformat(end.replace("Z", "+00:00"))
        - datetime.fromisoformat(start.replace("Z", "+00:00"))
    ).total_seconds()
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def summary_lines(run: dict[str, Any]) -> list[str]:
    lines = [
        f"run {run['id']} ({run.get('pattern')}): {run['status'].upper()}",
        f"  duration {_duration(run)}, {run.get('step_count', 0)} steps, "
        f"attempts {run.get('attempts', 0)}",
    ]
    if run.get("terminal_reason"):
        lines.append(f"  reason: {run['terminal_reason']}")
    if run.get("failure_reason"):
        lines.append(f"  failure: {run['failure_reason']}")
    return lines


def _parked_advice(api: Api, run: dict[str, Any]) -> list[str]:
    status, run_id = run["status"], run["id"]
    if status == "waiting_approval":
        lines = ["The run waits for an approval of a gated tool call:"]
        try:
            pending = api.request("GET", "approvals", params={"run": run_id, "status": "pending"})
        except CliError:
            pending = {"results": []}
        lines += approval_commands(pending.get("results", []))
        lines.append(f"Then follow it again: loopwright watch {run_id} (--through-approvals)")
        return lines
    if status == "waiting_human":
        return [
            "The run waits for a human: review its result, then",
            f"  accept: POST /api/v1/runs/{run_id}/accept, or cancel/retry it.",
        ]
    return [
        f"The run is {status}: resume it with POST /api/v1/runs/{run_id}/resume "
        f"(blocked runs need their budget raised first), then loopwright watch {run_id}.",
    ]


@dataclass
class Watcher:
    """Follows a run's live stream (``GET /runs/{id}/stream``) until it ends or parks, and
    reconnects with ``Last-Event-ID`` when the connection drops (a restarting server is waited
    for); ``through_approvals`` keeps following while the run waits for an approval."""

    api: Api
    out: TextIO
    sleep: Callable[[float], None] = time.sleep
    through_approvals: bool = False
    after_seq: int = 0
    steps: dict[int, str] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=lambda: {"tokens": 0.0, "cost": 0.0})
    failures: int = 0
    reached: bool = False
    announced: set[str] = field(default_factory=set)

    def follow(self, run_id: str) -> dict[str, Any]:
        while True:
            try:
                if self._connect(run_id):
                    run: dict[str, Any] = self.api.request("GET", f"runs/{run_id}")
                    return run
            except CliError as exc:
                self.failures += 1
                if not (exc.transient and self.reached) or self.failures >= MAX_POLL_FAILURES:
                    raise
                self.sleep(POLL_SECONDS)

    def _steps_after(self) -> int:
        """Reconnecting: the steps after the last finished one printed (open ones come again)."""
        unfinished = [seq for seq, status in self.steps.items() if status in OPEN_STEPS]
        return min(unfinished) - 1 if unfinished else max(self.steps, default=0)

    def _connect(self, run_id: str) -> bool:
        """One connection; True when the run ended or parked, False to reconnect."""
        headers = {"Accept": "application/json, text/event-stream"}
        if self.after_seq:
            headers["Last-Event-ID"] = str(self.after_seq)
        params = {"steps_after": self._steps_after()}
        for kind, data in sse_messages(self.api.lines(f"runs/{run_id}/stream", headers, params)):
            self.reached, self.failures = True, 0
            if self.handle(kind, data):
                return True
        return False

    def handle(self, kind: str, data: dict[str, Any]) -> bool:
        """Print one message; True when following should stop."""
        if kind == "event":
            print(format_event(data), file=self.out, flush=True)
            self.after_seq = max(self.after_seq, int(data["seq"]))
        elif kind == "step":
            self._step(data)
        elif kind == "run":
            return self._run(data)
        return kind == "done"

    def _step(self, step: dict[str, Any]) -> None:
        seq, status = int(step["seq"]), str(step.get("status"))
        if self.steps.get(seq) == status:
            return  # sent again after a reconnect
        if status not in OPEN_STEPS:
            self.totals["tokens"] += int(step.get("tokens_in") or 0) + int(
                step.get("tokens_out") or 0
            )
            self.totals["cost"] += float(step.get("cost") or 0)
        self.steps[seq] = status
        print(step_line(step, self.totals), file=self.out, flush=True)

    def _run(self, run: dict[str, Any]) -> bool:
        status = str(run.get("status"))
        if status != "waiting_approval" or not self.through_approvals:
            return status in PARKED
        fresh = [a for a in run.get("pending_approvals") or [] if a["id"] not in self.announced]
        if fresh:
            print("waiting for approval (decide in another terminal):", file=self.out)
            for line in approval_commands(fresh):
                print(line, file=self.out, flush=True)
            self.announced.update(a["id"] for a in fresh)
        return False


def watch(
    api: Api,
    run_id: str,
    out: TextIO,
    sleep: Callable[[float], None] = time.sleep,
    through_approvals: bool = False,
) -> int:
    print(f"watching run {run_id} (Ctrl-C stops watching; the run goes on)", file=out)
    watcher = Watcher(api=api, out=out, sleep=sleep, through_approvals=through_approvals)
    run = watcher.follow(run_id)
    print("", file=out)
    for line in summary_lines(run):
        print(line, file=out)
    if watcher.totals["tokens"] or watcher.totals["cost"]:
        tokens, cost = int(watcher.totals["tokens"]), money(watcher.totals["cost"])
        print(f"  model usage seen: {tokens:,} tokens, {cost}", file=out)
    if run["status"] in PARKED:
        for line in _parked_advice(api, run):
            print(line, file=out)
    return EXIT_OK if run["status"] == "succeeded" else EXIT_NOT_SUCCEEDED


# --- commands ------------------------------------------------------------------------------------


def cmd_trigger(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    inputs = parse_inputs(args.input or [])
    body: dict[str, Any] = {"inputs": inputs}
    overrides = parse_overrides(args.override or [], args.overrides_json)
    if overrides is not None:
        body["harness_overrides"] = overrides
    try:
        run = api.request("POST", f"patterns/{quote(args.pattern, safe='')}/trigger", json=body)
    except CliError as exc:
        if exc.status == 404:
            raise CliError(
                f"Not found: no pattern with key {args.pattern!r} at {api.url} "
                "(the key is the one in GET /api/v1/patterns and the pattern's page)."
            ) from exc
        raise
    print(f"run {run['id']} of {run['pattern']} is {run['status']}", file=out)
    if run.get("goal"):
        print(f"  goal: {_short(run['goal'], 200)}", file=out)
    notices = run.get("harness_notices") or []
    if notices:
        print("harness overrides looser than an earlier layer were not applied:", file=out)
        for line in notice_lines(notices):
            print(line, file=out)
    if not args.watch:
        return EXIT_OK
    return watch(api, str(run["id"]), out)


def cmd_watch(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    return watch(api, args.run_id, out, through_approvals=args.through_approvals)


def approval_line(approval: dict[str, Any]) -> str:
    """One pending approval: its id, run, tool and arguments, and why it asks."""
    arguments = json.dumps(approval.get("arguments"), ensure_ascii=False, sort_keys=True)
    reason = approval.get("reason") or ""
    return (
        f"{approval['id']}  run {approval.get('run')}  {approval.get('tool_name')} "
        f"{_short(arguments, 160)}" + (f"  ({_short(reason, 120)})" if reason else "")
    )


def cmd_approvals(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    params = {"status": "pending"} | ({"run": args.run} if args.run else {})
    found = api.request("GET", "approvals", params=params)
    pending = found.get("results", []) if isinstance(found, dict) else found
    if not pending:
        print("no pending approvals", file=out)
    for approval in pending:
        print(approval_line(approval), file=out)
    return EXIT_OK


def _decide(api: Api, args: argparse.Namespace, out: TextIO, decision: str) -> int:
    body = {"decision": decision, "reason": args.reason or ""}
    try:
        decided = api.request(
            "POST", f"approvals/{quote(args.approval_id, safe='')}/decide", json=body
        )
    except CliError as exc:
        if exc.status == 404:
            raise CliError(f"Not found: no approval {args.approval_id!r} at {api.url}.") from exc
        raise
    print(f"approval {decided['id']} {decided.get('status', decision)}", file=out)
    return EXIT_OK


def cmd_approve(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    return _decide(api, args, out, "approve")


def cmd_reject(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    return _decide(api, args, out, "reject")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loopwright",
        description="Trigger Loopwright patterns and follow their runs "
        "(LOOPWRIGHT_URL, LOOPWRIGHT_TOKEN).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    trigger = commands.add_parser("trigger", help="start a run of a pattern")
    trigger.add_argument("pattern", help="the pattern's key")
    trigger.add_argument(
        "--input",
        action="append",
        metavar="KEY=VALUE",
        help="a goal template input; the value is parsed as JSON when it is valid JSON "
        "(repeatable)",
    )
    trigger.add_argument(
        "--override",
        action="append",
        metavar="SECTION.KEY=VALUE",
        help="a harness setting for this run only, e.g. limits.maxInvocations=3 or "
        "tools.deny='[\"write\"]'; the value is parsed as JSON when it is valid JSON; it can "
        "only tighten (repeatable)",
    )
    trigger.add_argument(
        "--overrides-json",
        metavar="JSON",
        help="the run's harness overrides as one JSON object (--override values go on top)",
    )
    trigger.add_argument("--watch", action="store_true", help="follow the run until it ends")
    trigger.set_defaults(handler=cmd_trigger)
    follow = commands.add_parser(
        "watch", help="follow a run live (events, steps, tokens, cost) until it ends"
    )
    follow.add_argument("run_id", help="the run's id")
    follow.add_argument(
        "--through-approvals",
        action="store_true",
        help="keep following while the run waits for an approval (decide it with "
        "loopwright approve/reject in another terminal)",
    )
    follow.set_defaults(handler=cmd_watch)
    listing = commands.add_parser("approvals", help="list the pending approvals")
    listing.add_argument("--run", help="only this run's")
    listing.set_defaults(handler=cmd_approvals)
    for name, handler, verb in (
        ("approve", cmd_approve, "approve"),
        ("reject", cmd_reject, "reject"),
    ):
        decide = commands.add_parser(name, help=f"{verb} a pending tool call")
        decide.add_argument("approval_id", help="the approval's id (loopwright approvals)")
        decide.add_argument("--reason", help="why (recorded with the decision)")
        decide.set_defaults(handler=handler)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    try:
        api = api_from_env()
    except CliError as exc:
        print(f"loopwright: {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        handler: Callable[[Api, argparse.Namespace, TextIO], int] = args.handler
        return handler(api, args, out)
    except CliError as exc:
        print(f"loopwright: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("\nstopped watching; the run goes on.", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        api.close()


if __name__ == "__main__":
    sys.exit(main())
