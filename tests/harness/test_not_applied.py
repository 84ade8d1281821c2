"""``not_applied``: what a layer asked for that the compilation did not give it, field by field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness.compile import (
    RULES,
    Layer,
    harness_compile,
    layer_from_settings,
    layer_parse,
    not_applied,
)
from harness.schema import DEFAULT_PLATFORM, HarnessSettings


def platform() -> Layer:
    return layer_from_settings("platform", HarnessSettings.model_validate(DEFAULT_PLATFORM))


def notices(profile: dict[str, Any], run: dict[str, Any], *middle: Layer) -> list[dict[str, Any]]:
    """Compile platform → profile:p@1 → ``middle`` → run and list what the run did not get."""
    run_layer = layer_parse("run", run)
    layers = [platform(), layer_parse("profile:p@1", profile), *middle, run_layer]
    return sorted(not_applied(harness_compile(layers), run_layer), key=lambda n: n["field"])


def notice(field: str, asked: Any, got: Any, by: str = "profile:p@1") -> dict[str, Any]:
    return {"field": field, "asked": asked, "got": got, "decidedBy": by}


@pytest.mark.parametrize(
    ("profile", "run", "expected"),
    [
        # numbers: a higher value than the minimum is not applied; a lower one is
        (
            {"limits": {"maxTokens": 100}},
            {"limits": {"maxTokens": 500}},
            [notice("limits.maxTokens", 500, 100)],
        ),
        ({"limits": {"maxTokens": 100}}, {"limits": {"maxTokens": 50}}, []),
        (
            {"paths": {"maxFiles": 3}},
            {"paths": {"maxFiles": 10}},
            [notice("paths.maxFiles", 10, 3)],
        ),
        (
            {"limits": {"maxCost": 2.5}},
            {"limits": {"maxCost": 10}},
            [notice("limits.maxCost", 10, 2.5)],
        ),
        ({"limits": {"maxCost": 3}}, {"limits": {"maxCost": 3.0}}, []),
        # allow lists: names outside the intersection are not applied
        (
            {"tools": {"allow": ["read", "write"]}},
            {"tools": {"allow": ["*"]}},
            [notice("tools.allow", ["*"], ["read", "write"])],
        ),
        (
            {"tools": {"allow": ["read", "write"]}},
            {"tools": {"allow": ["bash", "read", "write"]}},
            [notice("tools.allow", ["bash", "read", "write"], ["read", "write"])],
        ),
        ({"tools": {"allow": ["*"]}}, {"tools": {"allow": ["read"]}}, []),
        (
            {"tools": {"trustedPreHandlerTools": ["edit"]}},
            {"tools": {"trustedPreHandlerTools": ["edit", "write"]}},
            [notice("tools.trustedPreHandlerTools", ["edit", "write"], ["edit"])],
        ),
        (
            {"isolation": {"allowedHosts": ["pypi.org"]}},
            {"isolation": {"allowedHosts": ["*"]}},
            [notice("isolation.allowedHosts", ["*"], ["pypi.org"])],
        ),
        # booleans: a requirement another layer switched on is not applied as "off"
        (
            {"isolation": {"requireWorktree": True}},
            {"isolation": {"requireWorktree": False}},
            [notice("isolation.requireWorktree", False, True)],
        ),
        ({"isolation": {"requireWorktree": False}}, {"isolation": {"requireWorktree": True}}, []),
        # enumerations: the stricter value wins
        (
            {"isolation": {"networkAccess": "deny"}},
            {"isolation": {"networkAccess": "allow"}},
            [notice("isolation.networkAccess", "allow", "deny")],
        ),
        (
            {"isolation": {"mode": "worktree"}},
            {"isolation": {"mode": "none"}},
            [notice("isolation.mode", "none", "worktree")],
        ),
        (
            {"isolation": {"networkAccess": "restricted"}},
            {"isolation": {"networkAccess": "deny"}},
            [],
        ),
        # the "off" values of features not built yet are always what the run gets
        ({}, {"memory": {"enabled": False}, "observability": {"captureInputs": False}}, []),
    ],
)
def test_a_field_is_listed_when_the_result_is_stricter_than_what_the_layer_asked(
    profile: dict[str, Any], run: dict[str, Any], expected: list[dict[str, Any]]
) -> None:
    assert notices(profile, run) == expected


@pytest.mark.parametrize(
    ("profile", "run"),
    [
        ({"tools": {"deny": ["*"]}}, {"tools": {"deny": ["write"]}}),
        ({"tools": {"ask": ["write", "edit"]}}, {"tools": {"ask": ["bash"]}}),
        ({"paths": {"deny": ["*"]}}, {"paths": {"deny": ["secrets/**"]}}),
        ({"paths": {"deny": ["*.pem"]}}, {"paths": {"deny": ["secrets/**", ".env"]}}),
        (
            {"tools": {"effects": {"deploy": "external"}}},
            {"tools": {"effects": {"deploy": "write"}}},
        ),
    ],
)
def test_what_only_adds_is_never_listed(profile: dict[str, Any], run: dict[str, Any]) -> None:
    # A deny, an ask or a raised effect always holds in the result, even where the result is not
    # what the layer stated (it holds more).
    run_layer = layer_parse("run", run)
    compiled = harness_compile([platform(), layer_parse("profile:p@1", profile), run_layer])
    assert any(compiled.values[path] != asked for path, asked in run_layer.values.items())
    assert not_applied(compiled, run_layer) == []
    assert {path for path, rule in RULES.items() if rule.adds} == {
        "tools.ask",
        "tools.deny",
        "tools.effects",
        "paths.deny",
        "observability.redact",
    }


def test_decided_by_names_the_layer_whose_value_won() -> None:
    pattern = layer_parse("pattern", {"limits": {"maxTokens": 40}, "isolation": {"mode": "none"}})
    employee = layer_parse("employee:alice", {"isolation": {"networkAccess": "restricted"}})
    found = notices(
        {"limits": {"maxTokens": 100}, "isolation": {"networkAccess": "deny"}},
        {
            "limits": {"maxTokens": 500, "maxCost": 1000},
            "isolation": {"networkAccess": "allow", "allowedHosts": ["pypi.org"]},
        },
        pattern,
        employee,
    )
    assert found == [
        notice("isolation.networkAccess", "allow", "deny", "profile:p@1"),
        notice("limits.maxCost", 1000, 100.0, "platform"),
        notice("limits.maxTokens", 500, 40, "pattern"),
    ]
    assert json.loads(json.dumps(found)) == found


def test_decided_by_names_another_layer_when_an_intersection_drops_a_name_the_layer_asked() -> None:
    # The run narrows the allow list (so it is the last layer that tightened the field) but also
    # asks for "bash", which only the profile's list leaves out: the profile decided that.
    found = notices({"tools": {"allow": ["read", "write"]}}, {"tools": {"allow": ["bash", "read"]}})
    assert found == [notice("tools.allow", ["bash", "read"], ["read"], "profile:p@1")]


def test_a_layer_that_states_nothing_or_decides_everything_has_nothing_listed() -> None:
    assert notices({"limits": {"maxTokens": 100}}, {}) == []
    only = layer_parse("run", {"limits": {"maxTokens": 5}, "tools": {"allow": ["read"]}})
    compiled = harness_compile([platform(), only])
    assert not_applied(compiled, only) == []
    assert compiled.provenance["limits.maxTokens"] == "run"


def test_the_platform_layer_is_listed_for_every_field_a_later_layer_tightened() -> None:
    base = platform()
    profile = layer_parse("profile:p@1", {"limits": {"maxTokens": 7}, "tools": {"allow": ["a"]}})
    found = not_applied(harness_compile([base, profile]), base)
    assert sorted(n["field"] for n in found) == ["limits.maxTokens", "tools.allow"]
    assert {n["decidedBy"] for n in found} == {"profile:p@1"}
