"""``loopwright trigger --override / --overrides-json``: the run's harness layer from a terminal,
against a real server (pytest-django's live_server), and the notices of what was not applied."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from harness.services import profile_create
from loops.models import LoopEvent, LoopRun
from orchestrator import cli
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from tests.support.factories import make_pattern
from tests.support.workers import ROOT

# --- pure parts --------------------------------------------------------------------------------


def test_overrides_combine_json_and_pairs_with_typed_values() -> None:
    parsed = cli.parse_overrides(
        ["limits.maxInvocations=3", 'tools.deny=["write"]', "isolation.networkAccess=deny"],
        '{"limits": {"maxTokens": 1000, "maxInvocations": 9}}',
    )
    assert parsed == {
        "limits": {"maxTokens": 1000, "maxInvocations": 3},
        "tools": {"deny": ["write"]},
        "isolation": {"networkAccess": "deny"},
    }
    assert cli.parse_overrides([]) is None
    assert cli.parse_overrides([], "{}") == {}


@pytest.mark.parametrize(
    ("pairs", "raw", "message"),
    [
        (["limits=3"], None, "--override 'limits=3': expected section.key=value"),
        (["limits.maxInvocations"], None, "expected section.key=value"),
        (["limits.max.x=1"], None, "expected section.key=value"),
        ([], "{oops", "--overrides-json: not valid JSON"),
        ([], "[1]", "--overrides-json: expected a JSON object"),
        (["limits.maxTokens=1"], '{"limits": 5}', "limits is not an object"),
    ],
)
def test_malformed_overrides_name_the_option(
    pairs: list[str], raw: str | None, message: str
) -> None:
    with pytest.raises(cli.CliError, match=message.replace("(", r"\(").replace("[", r"\[")):
        cli.parse_overrides(pairs, raw)


def test_a_notice_line_says_who_what_it_got_and_which_layer() -> None:
    notice = {"role": "maker", "employee": "mk", "field": "limits.maxInvocations", "asked": 10,
              "got": 2, "decidedBy": "profile:tight@1"}  # fmt: skip
    assert cli.notice_lines([notice]) == [
        "  not applied for maker mk: limits.maxInvocations = 2 (asked 10; set by profile:tight@1)"
    ]


# --- against a live server ---------------------------------------------------------------------

live = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server(
    live_server: Any, seeded_profiles: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    user = user_ensure(username="ops", roles=[Role.OPERATOR])
    env = {"LOOPWRIGHT_URL": live_server.url, "LOOPWRIGHT_TOKEN": api_token_create(user=user)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    profile_create(tag="tight", settings={"limits": {"maxInvocations": 2}})
    yield env


@live
def test_a_looser_override_gets_the_profile_value_and_the_cli_says_so(
    server: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    pattern = make_pattern(goal_template="Go", maker_harness_tag="tight", maker_usernames=["mk"])
    argv = ["trigger", pattern.key, "--override", "limits.maxInvocations=10",
            "--overrides-json", '{"limits": {"maxToolCalls": 4}}']  # fmt: skip
    code = cli.main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    run = LoopRun.objects.get(pattern=pattern)
    maker = run.harness_snapshots["makers"]["mk"]
    assert maker["settings"]["limits"]["maxInvocations"] == 2
    assert maker["settings"]["limits"]["maxToolCalls"] == 4
    assert maker["provenance"]["limits.maxToolCalls"] == "run"
    assert "harness overrides looser than an earlier layer were not applied:" in out
    assert (
        "  not applied for maker mk: limits.maxInvocations = 2 (asked 10; set by profile:tight@1)"
        in out.splitlines()
    )
    created = LoopEvent.objects.get(run=run, type="run.created")
    assert created.data["harness_overrides"] == {
        "limits": {"maxInvocations": 10, "maxToolCalls": 4}
    }


@live
def test_an_invalid_override_is_refused_naming_the_field(
    server: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    pattern = make_pattern(goal_template="Go")
    assert cli.main(["trigger", pattern.key, "--override", "limits.maxInvocations=lots"]) == 1
    err = capsys.readouterr().err
    assert "Invalid input" in err
    assert "\n  harness_overrides.limits.maxInvocations: " in err
    assert cli.main(["trigger", pattern.key, "--override", "limits.bogus=1"]) == 1
    assert "harness_overrides.limits.bogus: " in capsys.readouterr().err
    assert cli.main(["trigger", pattern.key, "--override", "limits=1"]) == 1
    assert "expected section.key=value" in capsys.readouterr().err
    assert not LoopRun.objects.exists()


@live
def test_the_wrapper_passes_overrides_as_a_real_process(server: dict[str, str]) -> None:
    pattern = make_pattern(goal_template="Go", maker_usernames=["mk"])
    result = subprocess.run(
        [str(ROOT / "bin" / "loopwright"), "trigger", pattern.key,
         "--override", 'tools.deny=["bash"]', "--override", "limits.maxInvocations=3"],
        env={**os.environ, **server}, capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    run = LoopRun.objects.get(pattern=pattern)
    for snapshot in (run.harness_snapshots["leader"], run.harness_snapshots["makers"]["mk"]):
        assert "bash" in snapshot["settings"]["tools"]["deny"]
        assert snapshot["settings"]["limits"]["maxInvocations"] == 3
        assert snapshot["layers"][-1] == "run"
    assert json.loads(json.dumps(run.harness_snapshots))  # plain JSON all the way down
