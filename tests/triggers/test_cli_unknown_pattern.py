"""``loopwright trigger`` names the pattern it could not find (issue 19), against a real server."""

from __future__ import annotations

from typing import Any

import pytest

from loops.models import LoopRun
from orchestrator import cli
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("key", ["nightly-tidy", "with space/and slash"])
def test_an_unknown_pattern_is_named_in_the_error(
    key: str, live_server: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    user = user_ensure(username="ops", roles=[Role.OPERATOR])
    monkeypatch.setenv("LOOPWRIGHT_URL", live_server.url)
    monkeypatch.setenv("LOOPWRIGHT_TOKEN", api_token_create(user=user))
    assert cli.main(["trigger", key]) == 1
    err = capsys.readouterr().err
    assert f"Not found: no pattern with key {key!r} at {live_server.url}" in err
    assert not LoopRun.objects.exists()
