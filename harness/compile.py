"""Layered compilation of harness settings: most restrictive wins. Pure: no Django, no database.

Layers are stacked ``platform → profile:<tag>@<version> → pattern → employee:<username> → run``
and every field is merged with the *meet* of its strictness order, so the result is the same for
any order of the layers and adding a layer can only tighten it:

- allow lists, trusted tools, allowed employees, connectors and hosts, memory scopes:
  intersection (``"*"`` is every name, the identity of intersection; a host pattern
  ``*.example.com`` holds every name under it);
- ask and deny, denied paths, redaction patterns: union;
- per-tool effects: the most severe effect per tool (read < write < external);
- numbers: minimum;
- capability booleans (memory.enabled/write, observability.enabled/captureInputs/captureOutputs):
  AND;
- requirement booleans (isolation.requireWorktree): OR;
- isolation.mode: worktree over none; isolation.networkAccess: deny < restricted < allow.

A field a layer leaves out is no opinion and changes nothing. Compilation starts from the loosest
value of every field (:data:`TOP`), which the platform layer bounds in practice. One exception
keeps that safe: a profile that omits ``tools.trustedPreHandlerTools`` trusts nothing
(:data:`PROFILE_DEFAULTS`), so no write runs without a human unless a profile names it. The
provenance of a field names the last layer that tightened it (or the first that stated it, when
none did).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from harness.schema import (
    EFFECTS,
    ISOLATION_MODES,
    MEMORY_SCOPES,
    NETWORK_ACCESS,
    NUMBER_MAXIMA,
    WILDCARD,
    HarnessLayer,
    HarnessSettings,
    layer_validate,
)

ALL: frozenset[str] = frozenset({WILDCARD})
NONE: frozenset[str] = frozenset()
DEFAULT_SOURCE = "default"
"""Provenance of a field no layer stated (never seen when the platform layer is complete)."""

_SEVERITY = {effect: rank for rank, effect in enumerate(EFFECTS)}


def meet_names(a: frozenset[str], b: frozenset[str]) -> frozenset[str]:
    """Intersection where ``"*"`` means every name."""
    if WILDCARD in a:
        return b
    if WILDCARD in b:
        return a
    return a & b


def host_covers(pattern: str, host: str) -> bool:
    """Does ``pattern`` (``"*"``, ``example.com``, ``*.example.com``) match every name ``host``
    (itself a name or a ``*.`` pattern) matches? ``*.example.com`` does not cover
    ``example.com``. Names compare case-insensitively."""
    pattern, host = pattern.lower(), host.lower()
    if pattern in (WILDCARD, host):
        return True
    return pattern.startswith("*.") and host.endswith(pattern[1:])


def meet_hosts(a: frozenset[str], b: frozenset[str]) -> frozenset[str]:
    """The hosts both lists allow: every entry of either that the other covers.

    ``["*.example.com"]`` meet ``["api.example.com"]`` is ``["api.example.com"]``; the result
    is the same for any order and grouping (coverage is transitive and two patterns covering
    one name are nested)."""
    if WILDCARD in a:
        return b
    if WILDCARD in b:
        return a
    return frozenset(
        {h for h in a if any(host_covers(p, h) for p in b)}
        | {h for h in b if any(host_covers(p, h) for p in a)}
    )


def join_names(a: frozenset[str], b: frozenset[str]) -> frozenset[str]:
    """Union where ``"*"`` absorbs everything."""
    if WILDCARD in a or WILDCARD in b:
        return ALL
    return a | b


def join_effects(a: Mapping[str, str], b: Mapping[str, str]) -> Mapping[str, str]:
    """Per tool, the more severe effect. ``read`` entries add nothing: an effect only raises."""
    merged = dict(a)
    for tool, effect in b.items():
        if _SEVERITY[effect] > _SEVERITY[merged.get(tool, "read")]:
            merged[tool] = effect
    return merged


def _stricter_of(order: tuple[str, ...]) -> Callable[[str, str], str]:
    """Merge for an enumeration listed from the strictest to the loosest value."""
    rank = {value: index for index, value in enumerate(order)}

    def merge(a: str, b: str) -> str:
        return a if rank[a] <= rank[b] else b

    return merge


def _and(a: bool, b: bool) -> bool:
    return a and b


def _or(a: bool, b: bool) -> bool:
    return a or b


@dataclass(frozen=True, slots=True)
class Rule:
    """How one field merges: ``merge`` is the meet of its strictness order, ``top`` its loosest.

    ``adds`` is True for a rule where a layer's statement only adds (a deny list, raised
    effects): the result then always holds what the layer said, so nothing it asked is lost."""

    kind: str
    merge: Callable[[Any, Any], Any]
    top: Any
    adds: bool = False


def _intersect(top: frozenset[str] = ALL) -> Rule:
    return Rule("intersection", meet_names, top)


def _minimum(path: str) -> Rule:
    return Rule("minimum", min, NUMBER_MAXIMA[path])


_UNION = Rule("union", join_names, NONE, adds=True)
_AND = Rule("and (a capability)", _and, True)
_OR = Rule("or (a requirement)", _or, False)

RULES: dict[str, Rule] = {
    "tools.allow": _intersect(),
    "tools.ask": _UNION,
    "tools.deny": _UNION,
    "tools.effects": Rule("most severe effect per tool", join_effects, {}, adds=True),
    "tools.trustedPreHandlerTools": _intersect(),
    "memory.enabled": _AND,
    "memory.scopes": _intersect(frozenset(MEMORY_SCOPES)),
    "memory.maxChars": _minimum("memory.maxChars"),
    "memory.maxItems": _minimum("memory.maxItems"),
    "memory.write": _AND,
    "delegation.allowedEmployees": _intersect(),
    "delegation.maxDepth": _minimum("delegation.maxDepth"),
    "delegation.maxCount": _minimum("delegation.maxCount"),
    "limits.timeoutMs": _minimum("limits.timeoutMs"),
    "limits.recursionLimit": _minimum("limits.recursionLimit"),
    "limits.maxInvocations": _minimum("limits.maxInvocations"),
    "limits.maxToolCalls": _minimum("limits.maxToolCalls"),
    "limits.maxTokens": _minimum("limits.maxTokens"),
    "limits.maxCost": _minimum("limits.maxCost"),
    "limits.modelRetryWindowMs": _minimum("limits.modelRetryWindowMs"),
    "paths.deny": _UNION,
    "paths.maxFiles": _minimum("paths.maxFiles"),
    "isolation.mode": Rule("strictest (worktree < none)", _stricter_of(ISOLATION_MODES), "none"),
    "isolation.requireWorktree": _OR,
    "isolation.allowedConnectors": _intersect(),
    "isolation.networkAccess": Rule(
        "strictest (deny < restricted < allow)", _stricter_of(NETWORK_ACCESS), "allow"
    ),
    "isolation.allowedHosts": Rule("intersection of host patterns", meet_hosts, ALL),
    "observability.enabled": _AND,
    "observability.tracingRetentionDays": _minimum("observability.tracingRetentionDays"),
    "observability.captureInputs": _AND,
    "observability.captureOutputs": _AND,
    "observability.redact": _UNION,
    "observability.samplingRate": _minimum("observability.samplingRate"),
}
"""Every leaf field of the settings, by ``section.key`` path (the provenance keys)."""

TOP: dict[str, Any] = {path: rule.top for path, rule in RULES.items()}


@dataclass(frozen=True, slots=True)
class Layer:
    """A validated layer flattened for compilation: ``values`` maps field paths it states."""

    name: str
    values: Mapping[str, Any]


def name_set(names: list[str]) -> frozenset[str]:
    """A name list as a set; any list holding ``"*"`` is :data:`ALL`."""
    found = frozenset(names)
    return ALL if WILDCARD in found else found


def _normalized(value: Any) -> Any:
    if isinstance(value, list):
        return name_set(value)
    if isinstance(value, dict):
        return {tool: effect for tool, effect in value.items() if effect != "read"}
    return value


def layer_from_settings(name: str, settings: HarnessLayer | HarnessSettings) -> Layer:
    """Flatten already validated settings into a :class:`Layer` (cheap; no validation)."""
    values = {
        f"{section}.{key}": _normalized(value)
        for section, fields in settings.model_dump(exclude_unset=True).items()
        for key, value in fields.items()
    }
    return Layer(name=name, values=values)


PROFILE_DEFAULTS: dict[str, Any] = {"tools.trustedPreHandlerTools": NONE}
"""What a *profile* states when it omits a key. Trust is the one grant whose loosest value would
remove a human gate, so only a profile that names a tool trusts it; later layers can only narrow
that. Every other omitted key is no opinion, as in any layer."""


def profile_layer(name: str, settings: HarnessLayer) -> Layer:
    """The profile's layer: its settings, with :data:`PROFILE_DEFAULTS` for what it omits."""
    layer = layer_from_settings(name, settings)
    return Layer(name=name, values={**PROFILE_DEFAULTS, **layer.values})


def layer_parse(name: str, data: Any, prefix: Sequence[str | int] = ()) -> Layer:
    """Validate raw layer settings and flatten them; raises ``SettingsInvalid``."""
    return layer_from_settings(name, layer_validate(data, prefix))


def _json_value(value: Any) -> Any:
    if isinstance(value, frozenset):
        return sorted(value)
    if isinstance(value, dict):
        return dict(sorted(value.items()))
    return value


@dataclass(frozen=True)
class CompiledHarness:
    """The result of compilation: flat field values, their provenance and the layer names."""

    values: Mapping[str, Any]
    provenance: Mapping[str, str]
    layers: tuple[str, ...]
    #: The layers compiled, for :func:`not_applied` (not part of the result's value).
    sources: tuple[Layer, ...] = field(default=(), compare=False, repr=False)

    def settings_dict(self) -> dict[str, Any]:
        """The complete settings as fresh JSON data (camelCase, sorted lists)."""
        nested: dict[str, dict[str, Any]] = {}
        for path, value in self.values.items():
            section, key = path.split(".", 1)
            nested.setdefault(section, {})[key] = _json_value(value)
        return nested

    @cached_property
    def settings(self) -> HarnessSettings:
        return HarnessSettings.model_validate(self.settings_dict())


def harness_compile(layers: Sequence[Layer]) -> CompiledHarness:
    """Merge ``layers`` most-restrictive-wins, recording which layer decided each field."""
    values = dict(TOP)
    provenance = dict.fromkeys(RULES, DEFAULT_SOURCE)
    for layer in layers:
        for path, stated in layer.values.items():
            current = values[path]
            merged = RULES[path].merge(current, stated)
            if merged != current or provenance[path] == DEFAULT_SOURCE:
                values[path] = merged
                provenance[path] = layer.name
    return CompiledHarness(
        values, provenance, tuple(layer.name for layer in layers), sources=tuple(layers)
    )


def not_applied(compiled: CompiledHarness, layer: Layer) -> list[dict[str, Any]]:
    """What ``layer`` asked for that the compilation did not give it, field by field.

    A field is listed when the layer stated a value and the result is stricter than it (a lower
    number, a shorter allow list, a capability off, a requirement on); a statement that only adds
    (a deny, a raised effect) is always honoured. ``decidedBy`` names the layer whose value won.
    """
    notices = []
    others: CompiledHarness | None = None
    for path, stated in layer.values.items():
        got = compiled.values[path]
        if RULES[path].adds or got == stated:
            continue
        decided_by = compiled.provenance[path]
        if decided_by == layer.name:
            # The layer narrowed an intersection itself: the names it lost were withheld by
            # the stricter layers before or after it.
            if others is None:
                rest = [other for other in compiled.sources if other.name != layer.name]
                others = harness_compile(rest)
            decided_by = others.provenance[path]
        notices.append(
            {
                "field": path,
                "asked": _json_value(stated),
                "got": _json_value(got),
                "decidedBy": decided_by,
            }
        )
    return notices
