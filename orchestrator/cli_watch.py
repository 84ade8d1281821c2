"""``loopwright watch``: follow a run's live stream until it ends or parks, then sum it up
(status, duration, tokens and cost, the run's page, and what to do about a parked run).

No Django and nothing of the project (``bin/loopwright`` runs the CLI as a bare file).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TextIO

from orchestrator.cli_api import EXIT_NOT_SUCCEEDED, EXIT_OK, Api, CliError
from orchestrator.cli_color import PLAIN, Palette
from orchestrator.cli_output import (
    UNKNOWN_COST,
    approval_commands,
    format_event,
    money,
    sse_messages,
    step_line,
)

#: The pause before reconnecting to a stream that dropped.
POLL_SECONDS = 0.5
OPEN_STEPS = {"started", "gated", "approved"}
TERMINAL = {"succeeded", "failed", "canceled"}
#: Parked states: the run holds no worker and waits for a person.
PARKED = {"waiting_approval", "waiting_human", "paused", "blocked"}
#: Consecutive failed connections tolerated while watching (a restarting server), ~15 s.
MAX_POLL_FAILURES = 30


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


def _used(per_run: dict[str, Any], metric: str, seen: float) -> float:
    entry = per_run.get(metric)
    if isinstance(entry, dict) and entry.get("used") is not None:
        return float(entry["used"])
    return seen


def usage_line(run: dict[str, Any], seen: dict[str, float], unpriced: set[str]) -> str:
    """The run's tokens and cost: what its budget usage counts (every attempt), else what was
    seen streamed; ``cost unknown`` for calls to unpriced models (tokens and no cost)."""
    per_run = (run.get("budget_usage") or {}).get("perRun") or {}
    tokens = int(_used(per_run, "tokens", seen["tokens"]))
    cost = _used(per_run, "cost", seen["cost"])
    if not unpriced:
        return f"  tokens {tokens:,}, cost {money(cost)}"
    known = f"cost {money(cost)} + unknown" if cost else UNKNOWN_COST
    models = f"unpriced model{'s' if len(unpriced) > 1 else ''}: {', '.join(sorted(unpriced))}"
    return f"  tokens {tokens:,}, {known} ({models})"


def summary_lines(
    run: dict[str, Any],
    *,
    page_url: str = "",
    seen: dict[str, float] | None = None,
    unpriced: set[str] | None = None,
    paint: Palette = PLAIN,
) -> list[str]:
    """The run's status, duration, steps, tokens and cost, reasons and page."""
    status, steps = str(run["status"]), int(run.get("step_count") or 0)
    lines = [
        f"run {run['id']} ({run.get('pattern')}): {paint.status(status, status.upper())}",
        f"  duration {_duration(run)}, {steps} step{'' if steps == 1 else 's'}, "
        f"attempts {run.get('attempts', 0)}",
        usage_line(run, seen or {"tokens": 0.0, "cost": 0.0}, unpriced or set()),
    ]
    if run.get("terminal_reason"):
        lines.append(f"  reason: {run['terminal_reason']}")
    if run.get("failure_reason"):
        lines.append(f"  failure: {paint.error(str(run['failure_reason']))}")
    if page_url:
        lines.append(f"  page: {paint.link(page_url)}")
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
    paint: Palette = PLAIN
    after_seq: int = 0
    steps: dict[int, str] = field(default_factory=dict)
    totals: dict[str, float] = field(
        default_factory=lambda: {"tokens": 0.0, "cost": 0.0, "unpriced": 0.0}
    )
    #: The models that answered with tokens and no cost (their endpoints have no prices).
    unpriced: set[str] = field(default_factory=set)
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
            print(format_event(data, self.paint), file=self.out, flush=True)
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
            tokens = int(step.get("tokens_in") or 0) + int(step.get("tokens_out") or 0)
            cost = float(step.get("cost") or 0)
            self.totals["tokens"] += tokens
            self.totals["cost"] += cost
            if tokens and not cost:
                self.unpriced.add(str(step.get("name") or "?"))
                self.totals["unpriced"] += 1
        self.steps[seq] = status
        print(step_line(step, self.totals, self.paint), file=self.out, flush=True)

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
    paint: Palette = PLAIN,
) -> int:
    """Follow the run, print its summary; 0 when it succeeded, 2 when it ended otherwise or
    parked."""
    print(f"watching run {run_id} (Ctrl-C stops watching; the run goes on)", file=out)
    print(f"  page: {paint.link(api.page_url(run_id))}", file=out, flush=True)
    watcher = Watcher(
        api=api, out=out, sleep=sleep, through_approvals=through_approvals, paint=paint
    )
    run = watcher.follow(run_id)
    print("", file=out)
    lines = summary_lines(
        run,
        page_url=api.page_url(str(run["id"])),
        seen=watcher.totals,
        unpriced=watcher.unpriced,
        paint=paint,
    )
    for line in lines:
        print(line, file=out)
    if run["status"] in PARKED:
        for line in _parked_advice(api, run):
            print(line, file=out)
    return EXIT_OK if run["status"] == "succeeded" else EXIT_NOT_SUCCEEDED
