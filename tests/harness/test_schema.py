"""The settings schema: strict, every problem reported with a pointer, exported as JSON Schema."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel

from harness.compile import RULES
from harness.schema import (
    DEFAULT_PLATFORM,
    JSON_SCHEMA_PATH,
    HarnessLayer,
    HarnessSettings,
    SettingsInvalid,
    export_json_schema,
    json_pointer,
    json_schema_text,
    layer_validate,
    settings_problems,
)

FULL_LAYER: dict[str, Any] = {
    "tools": {
        "allow": ["read", "list"],
        "ask": ["write"],
        "deny": ["*"],
        "effects": {"write": "write", "deploy": "external"},
        "trustedPreHandlerTools": ["edit"],
    },
    "memory": {"enabled": False, "write": False, "scopes": [], "maxItems": 0, "maxChars": 0},
    "delegation": {"allowedEmployees": [], "maxDepth": 0, "maxCount": 0},
    "limits": {
        "timeoutMs": 1000,
        "recursionLimit": 5,
        "maxInvocations": 3,
        "maxToolCalls": 4,
        "maxTokens": 5,
        "maxCost": 1.5,
    },
    "paths": {"deny": ["secrets/**", "*.pem"], "maxFiles": 20},
    "isolation": {
        "mode": "worktree",
        "requireWorktree": True,
        "allowedConnectors": [],
        "networkAccess": "restricted",
        "allowedHosts": ["pypi.org", "*.example.com"],
    },
    "observability": {
        "enabled": False,
        "tracingRetentionDays": 0,
        "captureInputs": False,
        "captureOutputs": False,
    },
}
"""Every field stated: memory, delegation (sub-agents) and observability (spans) off."""


def pointers(data: Any) -> list[str]:
    return [p["pointer"] for p in settings_problems(data)]


def test_an_empty_layer_and_a_complete_layer_are_valid() -> None:
    assert settings_problems({}) == []
    assert settings_problems(FULL_LAYER) == []


def test_a_layer_keeps_only_what_it_states() -> None:
    layer = layer_validate({"limits": {"maxTokens": 10}})
    assert layer.model_dump(exclude_unset=True) == {"limits": {"maxTokens": 10}}


def test_unknown_keys_are_refused_at_every_level_with_their_path() -> None:
    problems = settings_problems({"tool": {}, "limits": {"maxTokenz": 1}})
    assert sorted((p["pointer"], p["code"]) for p in problems) == [
        ("/limits/maxTokenz", "unknown_key"),
        ("/tool", "unknown_key"),
    ]
    assert "maxTokenz" in next(p["detail"] for p in problems if p["pointer"] == "/limits/maxTokenz")


def test_python_field_names_are_not_accepted_in_place_of_the_camel_case_keys() -> None:
    assert pointers({"limits": {"max_tokens": 1}}) == ["/limits/max_tokens"]


@pytest.mark.parametrize(
    ("data", "pointer"),
    [
        ({"limits": {"maxTokens": "5"}}, "/limits/maxTokens"),
        ({"limits": {"maxTokens": 5.0}}, "/limits/maxTokens"),
        ({"limits": {"maxTokens": True}}, "/limits/maxTokens"),
        ({"memory": {"enabled": 1}}, "/memory/enabled"),
        ({"memory": {"enabled": "true"}}, "/memory/enabled"),
        ({"tools": {"allow": "read"}}, "/tools/allow"),
        ({"tools": {"allow": ["ok", 3]}}, "/tools/allow/1"),
        ({"tools": []}, "/tools"),
        ({"isolation": {"networkAccess": "open"}}, "/isolation/networkAccess"),
        ({"isolation": {"mode": "container"}}, "/isolation/mode"),
        ({"memory": {"scopes": ["public", "team"]}}, "/memory/scopes/1"),
        ({"tools": {"effects": {"write": "delete"}}}, "/tools/effects/write"),
    ],
)
def test_wrong_types_are_refused_without_coercion(data: dict[str, Any], pointer: str) -> None:
    assert pointers(data) == [pointer]


@pytest.mark.parametrize(
    ("data", "pointer"),
    [
        ({"limits": {"maxTokens": -1}}, "/limits/maxTokens"),
        ({"limits": {"maxTokens": 10**11}}, "/limits/maxTokens"),
        ({"limits": {"maxCost": -0.01}}, "/limits/maxCost"),
        ({"limits": {"maxCost": math.inf}}, "/limits/maxCost"),
        ({"limits": {"maxCost": math.nan}}, "/limits/maxCost"),
        ({"delegation": {"maxDepth": 11}}, "/delegation/maxDepth"),
        ({"observability": {"tracingRetentionDays": 4000}}, "/observability/tracingRetentionDays"),
        ({"observability": {"samplingRate": 1.5}}, "/observability/samplingRate"),
        ({"observability": {"samplingRate": math.nan}}, "/observability/samplingRate"),
        ({"tools": {"deny": ["rm -rf"]}}, "/tools/deny/0"),
        ({"tools": {"allow": [""]}}, "/tools/allow/0"),
        ({"tools": {"allow": ["x" * 200]}}, "/tools/allow/0"),
        ({"tools": {"allow": ["t"] * 2001}}, "/tools/allow"),
    ],
)
def test_out_of_range_values_are_refused(data: dict[str, Any], pointer: str) -> None:
    assert pointers(data) == [pointer]


def test_the_wildcard_is_a_name_list_entry_but_not_an_effects_key() -> None:
    assert settings_problems({"tools": {"allow": ["*"], "deny": ["*"]}}) == []
    problems = settings_problems({"tools": {"effects": {"*": "write"}}})
    assert [p["pointer"] for p in problems] == ["/tools/effects/*"]
    assert problems[0]["detail"].startswith("key '*'")


def test_an_integer_is_accepted_for_the_cost() -> None:
    assert layer_validate({"limits": {"maxCost": 3}}).limits.max_cost == 3.0  # type: ignore[union-attr]


def test_null_is_refused_because_absence_is_the_only_way_to_say_no_opinion() -> None:
    problems = settings_problems({"tools": None, "limits": {"maxTokens": None}})
    assert {p["pointer"] for p in problems} == {"/tools", "/limits/maxTokens"}
    assert {p["code"] for p in problems} == {"null_not_allowed"}


def test_every_problem_is_reported_not_just_the_first() -> None:
    data = {
        "tools": {"allow": [1, 2], "bogus": True},
        "limits": {"maxTokens": -1, "maxCost": "free"},
        "isolation": {"networkAccess": "open"},
        "extra": {},
    }
    assert sorted(pointers(data)) == [
        "/extra",
        "/isolation/networkAccess",
        "/limits/maxCost",
        "/limits/maxTokens",
        "/tools/allow/0",
        "/tools/allow/1",
        "/tools/bogus",
    ]


def test_a_non_object_is_one_problem_at_the_root() -> None:
    assert settings_problems([]) == [
        {"pointer": "", "detail": "expected an object", "code": "model_type"}
    ]


def test_layer_validate_raises_with_every_problem_and_a_pointer_prefix() -> None:
    with pytest.raises(SettingsInvalid) as caught:
        layer_validate({"limits": {"maxTokens": -1, "timeoutMs": "x"}}, ("pattern",))
    assert sorted(p["pointer"] for p in caught.value.problems) == [
        "/pattern/limits/maxTokens",
        "/pattern/limits/timeoutMs",
    ]


def test_pointers_escape_slash_and_tilde() -> None:
    assert json_pointer(["a/b", "c~d", 0]) == "/a~1b/c~0d/0"


def test_compiled_settings_need_every_field() -> None:
    HarnessSettings.model_validate(DEFAULT_PLATFORM)
    partial = {**DEFAULT_PLATFORM, "limits": {"maxTokens": 5}}
    with pytest.raises(ValueError, match="timeoutMs"):
        HarnessSettings.model_validate(partial)


def test_layer_and_compiled_models_have_the_same_fields_and_a_merge_rule_for_each() -> None:
    def leaves(model: type[BaseModel]) -> set[str]:
        out = set()
        for field in model.model_fields.values():
            args: tuple[Any, ...] = getattr(field.annotation, "__args__", (field.annotation,))
            (section,) = [a for a in args if a is not type(None)]
            out |= {f"{field.alias}.{sub.alias}" for sub in section.model_fields.values()}
        return out

    assert leaves(HarnessLayer) == leaves(HarnessSettings) == set(RULES)


def test_the_committed_json_schema_is_current() -> None:
    assert JSON_SCHEMA_PATH.read_text() == json_schema_text(), (
        "harness/settings.schema.json is stale: run `python -m harness.schema`"
    )


def test_the_json_schema_is_valid_draft_2020_12_and_strict() -> None:
    schema = export_json_schema()
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["additionalProperties"] is False
    assert "null" not in json.dumps(schema)
    assert set(schema["properties"]) == {
        "tools",
        "memory",
        "delegation",
        "limits",
        "paths",
        "isolation",
        "observability",
    }


@pytest.mark.parametrize(
    "data",
    [
        {},
        FULL_LAYER,
        {"tools": {"allow": ["*"]}},
        {"tool": {}},
        {"limits": {"maxTokens": -1}},
        {"limits": {"maxTokens": "5"}},
        {"limits": {"maxCost": 2}},
        {"memory": {"enabled": 1}},
        {"memory": {"scopes": ["team"]}},
        {"tools": {"deny": ["rm -rf"]}},
        {"tools": {"effects": {"*": "write"}}},
        {"tools": {"effects": {"x": "read"}}},
        {"isolation": {"networkAccess": "restricted"}},
        {"isolation": {"networkAccess": None}},
        {"limits": {"unknown": 1}},
        {"paths": {"deny": ["secrets/**"], "maxFiles": 3}},
        {"paths": {"deny": [""]}},
        {"paths": {"maxFiles": -1}},
        {"isolation": {"allowedHosts": ["*.example.com", "pypi.org"]}},
        {"isolation": {"allowedHosts": ["https://pypi.org"]}},
        {"memory": {"enabled": False, "scopes": [], "maxChars": 0}},
        {"isolation": {"allowedConnectors": []}},
        # memory binds: more than "off" is accepted
        {"memory": {"enabled": True, "write": True, "maxItems": 3}},
        {"memory": {"scopes": ["public"], "maxChars": 10_000_001}},
        # connectors bind (MCP servers): names are accepted
        {"isolation": {"allowedConnectors": ["github", "*"]}},
        # delegation binds (sub-agents): more than "off" is accepted
        {"delegation": {"maxDepth": 1, "maxCount": 3, "allowedEmployees": ["alice", "*"]}},
        # observability binds (spans): more than "off" is accepted
        {"observability": {"tracingRetentionDays": 7}},
        {"observability": {"captureOutputs": True, "enabled": True}},
        {"observability": {"enabled": "yes"}},
        {"observability": {"redact": ["sk-[A-Za-z0-9]+"]}},
        {"observability": {"redact": [""]}},
    ],
)
def test_the_json_schema_agrees_with_the_validator(data: dict[str, Any]) -> None:
    json_schema_valid = Draft202012Validator(export_json_schema()).is_valid(data)
    assert json_schema_valid == (settings_problems(data) == [])


# --- memory --------------------------------------------------------------------------------------


def test_the_memory_section_binds_read_write_scopes_items_and_size() -> None:
    layer = {
        "memory": {
            "enabled": True,
            "write": False,
            "scopes": ["public", "agent_user"],
            "maxItems": 5,
            "maxChars": 2000,
        }
    }
    assert settings_problems(layer) == []
    problems = settings_problems({"memory": {"maxItems": 1001, "maxChars": -1, "scopes": ["x"]}})
    assert sorted(p["pointer"] for p in problems) == [
        "/memory/maxChars",
        "/memory/maxItems",
        "/memory/scopes/0",
    ]


def test_a_snapshot_compiled_before_memory_was_built_reads_as_memory_off() -> None:
    old = {**DEFAULT_PLATFORM, "memory": {"enabled": False, "scopes": [], "maxChars": 0}}
    memory = HarnessSettings.model_validate(old).memory
    assert (memory.enabled, memory.write, memory.max_items) == (False, False, 0)


# --- paths and isolation.allowedHosts -----------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        {"paths": {"deny": ["secrets/**", "*.pem", ".env", "/abs/ok", "dir with space/x"]}},
        {"paths": {"deny": [], "maxFiles": 0}},
        {"paths": {"maxFiles": 1_000_000}},
        {"isolation": {"allowedHosts": ["*"]}},
        {"isolation": {"allowedHosts": ["api.example.com", "*.example.com", "localhost"]}},
        {"isolation": {"allowedHosts": ["10.0.0.1", "my-host.internal"]}},
        {"isolation": {"allowedHosts": []}},
    ],
)
def test_path_globs_file_limits_and_host_patterns_are_accepted(data: dict[str, Any]) -> None:
    assert settings_problems(data) == []


@pytest.mark.parametrize(
    ("data", "pointer"),
    [
        ({"paths": {"deny": [""]}}, "/paths/deny/0"),
        ({"paths": {"deny": ["ok", "nul\x00byte"]}}, "/paths/deny/1"),
        ({"paths": {"deny": ["x" * 501]}}, "/paths/deny/0"),
        ({"paths": {"deny": "secrets/**"}}, "/paths/deny"),
        ({"paths": {"deny": [3]}}, "/paths/deny/0"),
        ({"paths": {"deny": ["a"] * 2001}}, "/paths/deny"),
        ({"paths": {"maxFiles": -1}}, "/paths/maxFiles"),
        ({"paths": {"maxFiles": 1_000_001}}, "/paths/maxFiles"),
        ({"paths": {"maxFiles": "5"}}, "/paths/maxFiles"),
        ({"paths": {"maxFiles": 2.0}}, "/paths/maxFiles"),
        ({"paths": {"maxFiles": None}}, "/paths/maxFiles"),
        ({"paths": {"glob": []}}, "/paths/glob"),
        ({"isolation": {"allowedHosts": ["https://pypi.org"]}}, "/isolation/allowedHosts/0"),
        ({"isolation": {"allowedHosts": ["pypi.org:443"]}}, "/isolation/allowedHosts/0"),
        ({"isolation": {"allowedHosts": ["*example.com"]}}, "/isolation/allowedHosts/0"),
        ({"isolation": {"allowedHosts": ["api.*.com"]}}, "/isolation/allowedHosts/0"),
        ({"isolation": {"allowedHosts": ["-bad.com"]}}, "/isolation/allowedHosts/0"),
        ({"isolation": {"allowedHosts": ["a b.com"]}}, "/isolation/allowedHosts/0"),
        ({"isolation": {"allowedHosts": [""]}}, "/isolation/allowedHosts/0"),
        (
            {"isolation": {"allowedHosts": ["ok.com", "a" * 64 + ".com"]}},
            "/isolation/allowedHosts/1",
        ),
        ({"isolation": {"allowedHosts": "pypi.org"}}, "/isolation/allowedHosts"),
    ],
)
def test_bad_path_globs_file_limits_and_hosts_are_refused(
    data: dict[str, Any], pointer: str
) -> None:
    assert pointers(data) == [pointer]


def test_a_redaction_pattern_must_be_a_regular_expression() -> None:
    problems = settings_problems({"observability": {"redact": ["sk-\\w+", "(unclosed"]}})
    assert [(p["pointer"], p["code"]) for p in problems] == [
        ("/observability/redact/1", "invalid_pattern")
    ]
    assert problems[0]["detail"].startswith("not a regular expression: missing ), unterminated")
