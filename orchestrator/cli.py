"""``loopwright``: trigger a pattern, follow its run and decide its approvals from a terminal.

    loopwright trigger <pattern> [--input key=value ...] [--override section.key=value ...]
                                 [--overrides-json '{...}'] [--watch]
    loopwright watch <run-id> [--through-approvals]
    loopwright approvals [--run <run-id>]
    loopwright approve <approval-id | run-id> [--reason TEXT] [--review JSON]
    loopwright reject <approval-id | run-id> [--reason TEXT] [--review JSON]

Every command takes ``--color=auto|always|never`` and ``--no-color`` (docs: cli_color.py).
``--override`` and ``--overrides-json`` give the run's own harness layer (docs/harness.md): it
can only tighten. What it asks for beyond an earlier layer is not applied; the CLI prints each
such setting with the value the run got and the layer that set it.

It talks to the REST API only (no Django import, so it starts fast and runs anywhere):
``LOOPWRIGHT_URL`` (default http://127.0.0.1:8000) and ``LOOPWRIGHT_TOKEN`` (a bearer API token,
see ``manage.py create_api_token``). Exit codes: 0 done (the run succeeded, was triggered
without ``--watch``, the decision was taken), 1 an error (bad arguments, configuration, network,
the API refused), 2 the run ended otherwise or is parked waiting for a human, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TextIO
from urllib.parse import quote


def _bare_package() -> None:
    """Run as a bare file (``bin/loopwright``: ``python -P orchestrator/cli.py``), the sibling
    ``cli_*`` modules load as ``orchestrator.cli_*`` from this folder, without running
    ``orchestrator/__init__.py`` (Django settings and Celery: seconds the CLI does not need)."""
    package = types.ModuleType("orchestrator")
    package.__path__ = [os.path.dirname(os.path.abspath(__file__))]
    sys.modules.setdefault("orchestrator", package)


if not __package__:
    _bare_package()

from orchestrator.cli_api import (  # noqa: E402
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    Api,
    CliError,
    api_from_env,
    uuid_argument,
)
from orchestrator.cli_approvals import cmd_approvals, cmd_approve, cmd_reject  # noqa: E402
from orchestrator.cli_color import Palette, colour_wanted  # noqa: E402
from orchestrator.cli_output import _short, _wait_line, format_event  # noqa: E402
from orchestrator.cli_watch import summary_lines, watch  # noqa: E402

__all__ = [
    "Api",
    "CliError",
    "_wait_line",
    "build_parser",
    "format_event",
    "json",
    "main",
    "summary_lines",
    "watch",
]

Handler = Callable[[Api, argparse.Namespace, TextIO, Palette], int]


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


# --- commands ------------------------------------------------------------------------------------


def cmd_trigger(api: Api, args: argparse.Namespace, out: TextIO, paint: Palette) -> int:
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
    status = str(run["status"])
    print(f"run {run['id']} of {run['pattern']} is {paint.status(status)}", file=out)
    if not args.watch:  # else watching prints it
        print(f"  page: {paint.link(api.page_url(str(run['id'])))}", file=out)
    if run.get("goal"):
        print(f"  goal: {_short(run['goal'], 200)}", file=out)
    notices = run.get("harness_notices") or []
    if notices:
        print("harness overrides looser than an earlier layer were not applied:", file=out)
        for line in notice_lines(notices):
            print(line, file=out)
    if not args.watch:
        return EXIT_OK
    return watch(api, str(run["id"]), out, paint=paint)


def cmd_watch(api: Api, args: argparse.Namespace, out: TextIO, paint: Palette) -> int:
    uuid_argument("run_id", args.run_id, "a run id")
    return watch(api, args.run_id, out, through_approvals=args.through_approvals, paint=paint)


# --- arguments -----------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, exiting 1 on bad arguments (2 is kept for a run that did not succeed)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def _colour_options() -> _Parser:
    """``--color`` and ``--no-color``, before or after the command (the last one given wins)."""
    options = _Parser(add_help=False)
    options.add_argument(
        "--color",
        choices=["auto", "always", "never"],
        default=argparse.SUPPRESS,
        help="colour status words, roles and errors: auto (default: on a terminal, unless "
        "NO_COLOR is set; FORCE_COLOR forces it), always or never",
    )
    options.add_argument(
        "--no-color",
        dest="color",
        action="store_const",
        const="never",
        default=argparse.SUPPRESS,
        help="no colour (as --color=never)",
    )
    return options


def build_parser() -> argparse.ArgumentParser:
    colour = _colour_options()
    parser = _Parser(
        prog="loopwright",
        description="Trigger Loopwright patterns, follow their runs and decide their approvals "
        "(LOOPWRIGHT_URL, LOOPWRIGHT_TOKEN).",
        epilog="Exit codes: 0 done (a watched run succeeded), 1 an error (arguments, "
        "configuration, network, the API refused), 2 the watched run ended otherwise or is "
        "parked, 130 interrupted.",
        parents=[colour],
    )
    commands = parser.add_subparsers(dest="command", required=True)
    trigger = commands.add_parser("trigger", help="start a run of a pattern", parents=[colour])
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
        "watch",
        help="follow a run live (events, steps, tokens, cost) until it ends or parks",
        description="Follow a run live; at the end print its status, tokens, cost and page. "
        "Exit 0 when it succeeded, 2 when it ended otherwise or parked.",
        parents=[colour],
    )
    follow.add_argument("run_id", help="the run's id")
    follow.add_argument(
        "--through-approvals",
        action="store_true",
        help="keep following while the run waits for an approval (decide it with "
        "loopwright approve/reject in another terminal)",
    )
    follow.set_defaults(handler=cmd_watch)
    listing = commands.add_parser("approvals", help="list the pending approvals", parents=[colour])
    listing.add_argument("--run", help="only this run's")
    listing.set_defaults(handler=cmd_approvals)
    for name, handler, verb in (
        ("approve", cmd_approve, "approve"),
        ("reject", cmd_reject, "reject"),
    ):
        decide = commands.add_parser(
            name,
            help=f"{verb} a pending tool call",
            description=f"{verb.capitalize()} a pending tool call (needs the approver role or "
            "being one of the pattern's approvers). Exit 0 when decided, 1 otherwise.",
            parents=[colour],
        )
        decide.add_argument(
            "id",
            metavar="ID",
            help="the approval's id (loopwright approvals), or a run's id when that run has "
            "exactly one pending approval",
        )
        decide.add_argument(
            "--reason", metavar="TEXT", help="why (recorded with the decision; optional)"
        )
        decide.add_argument(
            "--review",
            metavar="JSON",
            help="the review, as JSON: needed when the call's tool asks for one (the "
            "approval's review_schema, a reviewed skill's), refused otherwise",
        )
        decide.set_defaults(handler=handler)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    choice = getattr(args, "color", "auto")
    paint = Palette(colour_wanted(choice, out, os.environ))
    errors = Palette(colour_wanted(choice, sys.stderr, os.environ))
    try:
        api = api_from_env()
    except CliError as exc:
        print(errors.error(f"loopwright: {exc}"), file=sys.stderr)
        return EXIT_ERROR
    try:
        handler: Handler = args.handler
        return handler(api, args, out, paint)
    except CliError as exc:
        print(errors.error(f"loopwright: {exc}"), file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("\nstopped watching; the run goes on.", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        api.close()


if __name__ == "__main__":
    sys.exit(main())
