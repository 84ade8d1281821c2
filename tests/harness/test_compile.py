"""Layered compilation: most restrictive wins per field, with provenance."""

from __future__ import annotations

from typing import Any

import pytest

from harness.compile import (
    DEFAULT_SOURCE,
    RULES,
    TOP,
    Layer,
    harness_compile,
    layer_from_settings,
    layer_parse,
    name_set,
    profile_layer,
)
from harness.schema import DEFAULT_PLATFORM, HarnessSettings, layer_validate


def platform() -> Any:
    return layer_from_settings("platform", HarnessSettings.model_validate(DEFAULT_PLATFORM))


def merged(path: str, *values: Any) -> Any:
    """Compile one layer per value for the field at ``path`` and return the JSON result."""
    section, key = path.split(".")
    layers = [layer_parse(f"l{i}", {section: {key: v}}) for i, v in enumerate(values)]
    return harness_compile(layers).settings_dict()[section][key]


@pytest.mark.parametrize(
    ("path", "values", "expected"),
    [
        ("tools.allow", (["a", "b", "c"], ["b", "c", "d"]), ["b", "c"]),
        ("tools.allow", (["*"], ["b", "a"]), ["a", "b"]),
        ("tools.allow", (["a"], ["*"]), ["a"]),
        ("tools.allow", (["*"], ["*"]), ["*"]),
        ("tools.allow", (["a"], []), []),
        ("tools.ask", (["a"], ["b"]), ["a", "b"]),
        ("tools.deny", (["a"], ["b"]), ["a", "b"]),
        ("tools.deny", (["a"], ["*"]), ["*"]),
        ("tools.trustedPreHandlerTools", (["a", "b"], ["b"]), ["b"]),
        (
            "tools.effects",
            ({"a": "write"}, {"a": "external", "b": "write"}),
            {"a": "external", "b": "write"},
        ),
        ("tools.effects", ({"a": "external"}, {"a": "write"}), {"a": "external"}),
        ("tools.effects", ({"a": "read"},), {}),
        ("limits.maxCost", (2.5, 10), 2.5),
        ("limits.timeoutMs", (1000, 0), 0),
        ("isolation.mode", ("none", "worktree"), "worktree"),
        ("isolation.mode", ("worktree", "none"), "worktree"),
        ("isolation.requireWorktree", (False, True, False), True),
        ("isolation.networkAccess", ("allow", "restricted"), "restricted"),
        ("isolation.networkAccess", ("deny", "allow"), "deny"),
        ("paths.deny", (["secrets/**"], ["*.pem", "secrets/**"]), ["*.pem", "secrets/**"]),
        ("paths.deny", (["secrets/**"], ["*"]), ["*"]),
        ("paths.deny", ([], []), []),
        ("paths.maxFiles", (100, 5, 20), 5),
        ("paths.maxFiles", (0, 10), 0),
        (
            "isolation.allowedHosts",
            (["api.example.com", "*.corp.io"], ["*.corp.io"]),
            ["*.corp.io"],
        ),
        ("isolation.allowedHosts", (["*"], ["pypi.org"]), ["pypi.org"]),
        ("isolation.allowedHosts", (["pypi.org"], ["github.com"]), []),
        # A wildcard domain holds the names under it, not the domain itself.
        ("isolation.allowedHosts", (["*.example.com"], ["api.example.com"]), ["api.example.com"]),
        ("isolation.allowedHosts", (["*.example.com"], ["example.com"]), []),
        (
            "isolation.allowedHosts",
            (["*.example.com", "x.org"], ["*.a.example.com", "y.org"]),
            ["*.a.example.com"],
        ),
        ("isolation.allowedConnectors", ([], []), []),
        ("memory.enabled", (True, False), False),
        ("memory.write", (True, True), True),
        ("memory.scopes", (["public", "user"], ["user", "agent_user"]), ["user"]),
        ("memory.maxChars", (4000, 200), 200),
        ("memory.maxItems", (20, 5), 5),
        ("delegation.maxCount", (0, 0), 0),
        ("observability.enabled", (True, False), False),
        ("observability.tracingRetentionDays", (30, 2), 2),
        ("observability.captureInputs", (True, False), False),
        ("observability.captureOutputs", (False, True), False),
        ("observability.redact", (["sk-\\w+"], ["[0-9]{16}"]), ["[0-9]{16}", "sk-\\w+"]),
        ("observability.samplingRate", (1.0, 0.25), 0.25),
    ],
)
def test_each_field_merges_most_restrictive_wins(
    path: str, values: tuple[Any, ...], expected: Any
) -> None:
    assert merged(path, *values) == expected


def raw(name: str, path: str, value: Any) -> Layer:
    """A layer built without the schema: the value may be one the schema refuses today."""
    return Layer(name, {path: name_set(value) if isinstance(value, list) else value})


@pytest.mark.parametrize(
    ("path", "values", "expected"),
    [
        ("delegation.allowedEmployees", (["alice", "bob"], ["bob"]), ["bob"]),
        ("delegation.maxDepth", (3, 1), 1),
        ("isolation.allowedConnectors", (["github"], ["jira"]), []),
        ("isolation.allowedConnectors", (["*"], ["jira"]), ["jira"]),
    ],
)
def test_rules_merge_layers_built_without_the_schema_most_restrictive_wins(
    path: str, values: tuple[Any, ...], expected: Any
) -> None:
    section, key = path.split(".")
    layers = [raw(f"l{i}", path, v) for i, v in enumerate(values)]
    assert harness_compile(layers).settings_dict()[section][key] == expected


def test_booleans_that_grant_combine_with_and_and_booleans_that_require_with_or() -> None:
    kinds = {path: rule.kind for path, rule in RULES.items() if isinstance(rule.top, bool)}
    assert kinds == {
        "memory.enabled": "and (a capability)",
        "memory.write": "and (a capability)",
        "observability.captureInputs": "and (a capability)",
        "observability.captureOutputs": "and (a capability)",
        "observability.enabled": "and (a capability)",
        "isolation.requireWorktree": "or (a requirement)",
    }


def test_an_absent_field_does_not_loosen_anything() -> None:
    strict = layer_parse("profile:p@1", {"limits": {"maxTokens": 10}, "tools": {"allow": ["a"]}})
    silent = layer_parse("pattern", {"memory": {"maxChars": 0}, "paths": {"deny": ["x/**"]}})
    empty = layer_parse("run", {})
    result = harness_compile([platform(), strict, silent, empty]).settings_dict()
    assert result["limits"]["maxTokens"] == 10
    assert result["tools"]["allow"] == ["a"]
    assert result["paths"]["maxFiles"] == DEFAULT_PLATFORM["paths"]["maxFiles"]
    assert result["isolation"]["allowedHosts"] == ["*"]


def test_without_any_layer_every_field_is_at_its_loosest() -> None:
    compiled = harness_compile([])
    assert dict(compiled.values) == TOP
    assert set(compiled.provenance.values()) == {DEFAULT_SOURCE}
    assert compiled.settings_dict()["tools"]["allow"] == ["*"]


def test_the_platform_layer_bounds_everything_and_is_named_as_the_source() -> None:
    compiled = harness_compile([platform()])
    assert compiled.settings_dict() == HarnessSettings.model_validate(DEFAULT_PLATFORM).model_dump()
    assert set(compiled.provenance.values()) == {"platform"}


def test_provenance_names_the_last_layer_that_tightened_each_field() -> None:
    layers = [
        platform(),
        layer_parse("profile:safe@2", {"tools": {"deny": ["write"]}, "limits": {"maxTokens": 100}}),
        layer_parse("pattern", {"tools": {"deny": ["edit"]}, "limits": {"maxTokens": 500}}),
        layer_parse("employee:alice", {"tools": {"deny": ["write"]}, "limits": {"maxTokens": 100}}),
        layer_parse(
            "run",
            {
                "isolation": {"networkAccess": "deny", "allowedHosts": ["pypi.org"]},
                "paths": {"deny": ["secrets/**"], "maxFiles": 10_000},
            },
        ),
    ]
    compiled = harness_compile(layers)
    assert compiled.provenance["tools.deny"] == "pattern"
    assert compiled.provenance["limits.maxTokens"] == "profile:safe@2"
    assert compiled.provenance["isolation.networkAccess"] == "run"
    assert compiled.provenance["isolation.allowedHosts"] == "run"
    assert compiled.provenance["paths.deny"] == "run"
    assert compiled.provenance["paths.maxFiles"] == "platform"  # equal, so not tightened
    assert compiled.provenance["memory.maxChars"] == "platform"
    assert compiled.layers == ("platform", "profile:safe@2", "pattern", "employee:alice", "run")


def test_the_result_is_complete_sorted_json_that_validates_as_compiled_settings() -> None:
    layers = [
        platform(),
        layer_parse("p", {"tools": {"allow": ["b", "a", "c"], "deny": ["z", "y"]}}),
    ]
    compiled = harness_compile(layers)
    data = compiled.settings_dict()
    assert data["tools"]["allow"] == ["a", "b", "c"]
    assert data["tools"]["deny"] == ["y", "z"]
    assert HarnessSettings.model_validate(data) == compiled.settings
    assert compiled.settings.limits.max_tokens == DEFAULT_PLATFORM["limits"]["maxTokens"]


def test_settings_dict_is_fresh_data_every_time() -> None:
    compiled = harness_compile([platform()])
    first = compiled.settings_dict()
    first["tools"]["allow"].append("mutated")
    first["limits"]["maxTokens"] = -1
    assert compiled.settings_dict()["tools"]["allow"] == ["*"]
    assert compiled.settings_dict()["limits"]["maxTokens"] == 2_000_000


def test_a_profile_that_omits_trusted_tools_trusts_none_and_later_layers_cannot_add_any() -> None:
    silent = profile_layer("profile:p@1", layer_validate({"tools": {"allow": ["*"]}}))
    pattern = layer_parse("pattern", {"tools": {"trustedPreHandlerTools": ["write"]}})
    compiled = harness_compile([platform(), silent, pattern])
    assert compiled.settings_dict()["tools"]["trustedPreHandlerTools"] == []
    assert compiled.provenance["tools.trustedPreHandlerTools"] == "profile:p@1"


def test_a_profile_grants_trust_and_a_later_layer_can_narrow_it() -> None:
    granting = profile_layer(
        "profile:p@1", layer_validate({"tools": {"trustedPreHandlerTools": ["edit", "write"]}})
    )
    pattern = layer_parse("pattern", {"tools": {"trustedPreHandlerTools": ["edit"]}})
    assert harness_compile([platform(), granting]).settings_dict()["tools"][
        "trustedPreHandlerTools"
    ] == ["edit", "write"]
    assert harness_compile([platform(), granting, pattern]).settings_dict()["tools"][
        "trustedPreHandlerTools"
    ] == ["edit"]
