"""Property tests of compilation and planning (hypothesis).

The strictness order used to check the results is written out here, independently of the merge
functions in harness.compile, so a wrong merge cannot vouch for itself.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.compile import (
    Layer,
    harness_compile,
    host_covers,
    layer_from_settings,
    layer_parse,
    name_set,
    not_applied,
)
from harness.planner import plan_tools
from harness.schema import DEFAULT_PLATFORM, HarnessSettings
from runtime.policy import Decision
from runtime.types import Effect, ToolSpec

NAMES = ["a", "b", "c", "d"]
SEVERITY = {"read": 0, "write": 1, "external": 2}

name_lists = st.lists(st.sampled_from([*NAMES, "*"]), max_size=5)
small = st.integers(min_value=0, max_value=50)


def section(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


layer_data = section(
    tools=section(
        allow=name_lists,
        ask=name_lists,
        deny=name_lists,
        effects=st.dictionaries(st.sampled_from(NAMES), st.sampled_from(list(SEVERITY))),
        trustedPreHandlerTools=name_lists,
    ),
    memory=section(
        enabled=st.booleans(),
        write=st.booleans(),
        scopes=st.lists(st.sampled_from(["public", "user", "agent_user"]), max_size=3),
        maxItems=small,
        maxChars=small,
    ),
    # Delegation's full value range is covered by test_the_rules_of_raw_layers_* below.
    delegation=section(allowedEmployees=st.just([]), maxDepth=st.just(0), maxCount=st.just(0)),
    limits=section(
        timeoutMs=small,
        modelRetryWindowMs=small,
        recursionLimit=small,
        maxInvocations=small,
        maxToolCalls=small,
        maxTokens=small,
        maxCost=st.floats(min_value=0, max_value=50, allow_nan=False),
    ),
    paths=section(
        deny=st.lists(st.sampled_from(["secrets/**", "*.pem", ".env", "build/*", "*"]), max_size=4),
        maxFiles=small,
    ),
    isolation=section(
        mode=st.sampled_from(["none", "worktree"]),
        requireWorktree=st.booleans(),
        allowedConnectors=st.just([]),
        networkAccess=st.sampled_from(["deny", "restricted", "allow"]),
        allowedHosts=st.lists(
            st.sampled_from(["pypi.org", "api.example.com", "*.example.com", "*"]), max_size=4
        ),
    ),
    observability=section(
        enabled=st.booleans(),
        tracingRetentionDays=small,
        captureInputs=st.booleans(),
        captureOutputs=st.booleans(),
        redact=st.lists(st.sampled_from([r"sk-\w+", "password=\\S+", "[0-9]{16}"]), max_size=3),
        samplingRate=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    ),
)
#: Whole value ranges of some merge rules, in layers built without the schema.
raw_data = st.fixed_dictionaries(
    {},
    optional={
        "memory.enabled": st.booleans(),
        "memory.scopes": st.lists(st.sampled_from(["public", "user", "agent_user"]), max_size=3),
        "memory.maxChars": small,
        "delegation.allowedEmployees": st.lists(st.sampled_from(["alice", "bob", "*"]), max_size=3),
        "delegation.maxDepth": st.integers(min_value=0, max_value=10),
        "delegation.maxCount": small,
        "isolation.allowedConnectors": st.lists(
            st.sampled_from(["github", "jira", "*"]), max_size=3
        ),
    },
)
layer_lists = st.lists(layer_data, max_size=5)
toolsets = st.lists(
    st.builds(
        ToolSpec,
        name=st.sampled_from(NAMES),
        description=st.just(""),
        parameters=st.just({}),
        effect=st.sampled_from(list(Effect)),
        enforceable=st.booleans(),
    ),
    max_size=4,
    unique_by=lambda t: t.name,
)

INTERSECTED = {
    "tools.allow",
    "tools.trustedPreHandlerTools",
    "memory.scopes",
    "delegation.allowedEmployees",
    "isolation.allowedConnectors",
    "isolation.allowedHosts",
}
UNIONED = {"tools.ask", "tools.deny", "paths.deny", "observability.redact"}
CAPABILITIES = {
    "memory.enabled",
    "memory.write",
    "observability.enabled",
    "observability.captureInputs",
    "observability.captureOutputs",
}
REQUIREMENTS = {"isolation.requireWorktree"}
RANKS = {
    "isolation.mode": {"worktree": 0, "none": 1},
    "isolation.networkAccess": {"deny": 0, "restricted": 1, "allow": 2},
}


def contains(names: list[str], sub: list[str]) -> bool:
    """Whether the name set ``names`` contains ``sub`` ("*" being every name)."""
    return "*" in names or ("*" not in sub and set(sub) <= set(names))


def as_strict(path: str, new: Any, old: Any) -> bool:
    """Whether ``new`` is at least as strict as ``old`` for the field at ``path``."""
    if path == "isolation.allowedHosts":  # patterns: every host left is one ``old`` allowed
        return all(any(host_covers(p, h) for p in old) for h in new)
    if path in INTERSECTED:
        return contains(old, new)
    if path in UNIONED:
        return contains(new, old)
    if path == "tools.effects":
        return all(SEVERITY[new.get(t, "read")] >= SEVERITY[e] for t, e in old.items())
    if path in CAPABILITIES:
        return not new or old
    if path in REQUIREMENTS:
        return new or not old
    if path in RANKS:
        return RANKS[path][new] <= RANKS[path][old]
    return bool(new <= old)


def flat(settings: dict[str, Any]) -> dict[str, Any]:
    return {f"{s}.{k}": v for s, fields in settings.items() for k, v in fields.items()}


def platform() -> Layer:
    return layer_from_settings("platform", HarnessSettings.model_validate(DEFAULT_PLATFORM))


def layers_of(data: list[dict[str, Any]]) -> list[Layer]:
    return [layer_parse(f"layer{i}", d) for i, d in enumerate(data)]


def compiled_settings(data: list[dict[str, Any]], with_platform: bool = True) -> dict[str, Any]:
    layers = ([platform()] if with_platform else []) + layers_of(data)
    return harness_compile(layers).settings_dict()


def listed(layer: dict[str, Any], key: str, name: str) -> bool | None:
    """Whether a layer lists ``name`` under tools.<key>; None when it has no opinion."""
    names = layer.get("tools", {}).get(key)
    return None if names is None else (name in names or "*" in names)


@settings(deadline=None)
@given(layer_lists, layer_data, st.integers(min_value=0, max_value=5))
def test_adding_a_layer_never_loosens_any_field(
    data: list[dict[str, Any]], extra: dict[str, Any], position: int
) -> None:
    before = flat(compiled_settings(data))
    after = flat(compiled_settings([*data[:position], extra, *data[position:]]))
    for path, old in before.items():
        assert as_strict(path, after[path], old), (path, after[path], old)


@settings(deadline=None)
@given(layer_lists)
def test_every_stated_value_bounds_the_result(data: list[dict[str, Any]]) -> None:
    result = flat(compiled_settings(data))
    for layer in data:
        for path, stated in flat(layer).items():
            assert as_strict(path, result[path], stated), (path, result[path], stated)


def normalized(value: Any) -> Any:
    if isinstance(value, list):
        return ["*"] if "*" in value else sorted(set(value))
    if isinstance(value, dict):
        return {tool: effect for tool, effect in sorted(value.items()) if effect != "read"}
    return value


@settings(deadline=None)
@given(layer_data)
def test_a_single_layer_compiles_to_exactly_what_it_states(data: dict[str, Any]) -> None:
    result = flat(compiled_settings([data], with_platform=False))
    for path, stated in flat(data).items():
        assert result[path] == normalized(stated), path


@settings(deadline=None)
@given(layer_lists, st.randoms(use_true_random=False))
def test_compilation_is_deterministic_and_independent_of_layer_order(
    data: list[dict[str, Any]], rng: Any
) -> None:
    shuffled = list(data)
    rng.shuffle(shuffled)
    expected = compiled_settings(data)
    assert compiled_settings(data) == expected
    assert compiled_settings(shuffled) == expected
    assert compiled_settings([*data, *data]) == expected


@settings(deadline=None)
@given(layer_lists)
def test_equal_layers_in_any_order_give_the_same_provenance(data: list[dict[str, Any]]) -> None:
    twins = [layer_parse("twin", d) for d in data]
    forward = harness_compile([platform(), *twins])
    backward = harness_compile([platform(), *reversed(twins)])
    assert forward.settings_dict() == backward.settings_dict()
    assert forward.provenance == backward.provenance


@settings(deadline=None)
@given(layer_lists)
def test_the_result_is_always_complete_valid_settings(data: list[dict[str, Any]]) -> None:
    # With the platform layer, as every real compilation has: without it the features not built
    # yet start at their loosest value, which the schema refuses.
    result = compiled_settings(data)
    HarnessSettings.model_validate(result)


@settings(deadline=None)
@given(layer_lists, toolsets)
def test_deny_always_wins(data: list[dict[str, Any]], tools: list[ToolSpec]) -> None:
    plan = plan_tools(harness_compile([platform(), *layers_of(data)]), tools)
    for tool in tools:
        if any(listed(layer, "deny", tool.name) for layer in data):
            assert plan.decision(tool.name) is Decision.DENY


@settings(deadline=None)
@given(layer_lists, toolsets)
def test_a_tool_is_allowed_only_when_every_layer_allows_it(
    data: list[dict[str, Any]], tools: list[ToolSpec]
) -> None:
    plan = plan_tools(harness_compile(layers_of(data)), tools)
    for planned in plan.tools:
        if planned.decision is not Decision.ALLOW:
            continue
        name = planned.name
        assert planned.spec.enforceable
        for layer in data:
            assert listed(layer, "allow", name) is not False
            assert not listed(layer, "ask", name)
            assert not listed(layer, "deny", name)
            if planned.effect is not Effect.READ:
                assert listed(layer, "trustedPreHandlerTools", name) is not False


@settings(deadline=None)
@given(layer_lists, layer_data, toolsets)
def test_adding_a_layer_never_turns_a_decision_more_permissive(
    data: list[dict[str, Any]], extra: dict[str, Any], tools: list[ToolSpec]
) -> None:
    order = {Decision.DENY: 0, Decision.ASK: 1, Decision.ALLOW: 2}
    before = plan_tools(harness_compile([platform(), *layers_of(data)]), tools)
    after = plan_tools(harness_compile([platform(), *layers_of([*data, extra])]), tools)
    for tool in tools:
        assert order[after.decision(tool.name)] <= order[before.decision(tool.name)]


@settings(deadline=None)
@given(layer_lists, toolsets)
def test_the_plan_from_a_snapshot_dict_equals_the_plan_from_the_compilation(
    data: list[dict[str, Any]], tools: list[ToolSpec]
) -> None:
    compiled = harness_compile([platform(), *layers_of(data)])
    assert (
        plan_tools(compiled.settings_dict(), tools).as_list()
        == plan_tools(compiled, tools).as_list()
    )


RAW_PATHS = [
    "memory.enabled",
    "memory.scopes",
    "memory.maxChars",
    "delegation.allowedEmployees",
    "delegation.maxDepth",
    "delegation.maxCount",
    "isolation.allowedConnectors",
]


def raw_layer(name: str, data: dict[str, Any]) -> Layer:
    return Layer(name, {p: name_set(v) if isinstance(v, list) else v for p, v in data.items()})


def raw_compiled(data: list[dict[str, Any]]) -> dict[str, Any]:
    return flat(
        harness_compile([raw_layer(f"l{i}", d) for i, d in enumerate(data)]).settings_dict()
    )


@settings(deadline=None)
@given(st.lists(raw_data, max_size=5), raw_data, st.integers(min_value=0, max_value=5))
def test_the_rules_of_raw_layers_never_loosen_and_ignore_order(
    data: list[dict[str, Any]], extra: dict[str, Any], position: int
) -> None:
    before = raw_compiled(data)
    after = raw_compiled([*data[:position], extra, *data[position:]])
    for path in RAW_PATHS:
        assert as_strict(path, after[path], before[path]), (path, after[path], before[path])
    assert raw_compiled(list(reversed(data))) == before
    for layer in data:
        for path, stated in layer.items():
            assert as_strict(path, before[path], stated), (path, before[path], stated)


@settings(deadline=None)
@given(layer_lists, layer_data)
def test_not_applied_lists_exactly_the_stated_fields_the_result_made_stricter(
    data: list[dict[str, Any]], run: dict[str, Any]
) -> None:
    run_layer = layer_parse("run", run)
    compiled = harness_compile([platform(), *layers_of(data), run_layer])
    result = flat(compiled.settings_dict())
    found = {n["field"]: n for n in not_applied(compiled, run_layer)}
    for path, stated in flat(run).items():
        differs = result[path] != normalized(stated)
        assert (path in found) == (differs and path not in UNIONED and path != "tools.effects")
        if path in found:
            assert found[path]["asked"] == normalized(stated)
            assert found[path]["got"] == result[path]
            assert as_strict(path, result[path], stated)
            assert found[path]["decidedBy"] in compiled.layers
            assert found[path]["decidedBy"] != "run"  # the run is never told it refused itself
    assert set(found) <= {p for p in flat(run)}
