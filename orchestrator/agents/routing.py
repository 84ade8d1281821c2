"""Model aliases: a name an employee routes its model calls by (docs/model-routing.md).

An alias holds ordered rules. The first rule that matches a call's pattern and role, and that
still has a target priced within its ceiling, decides the endpoint chain: its targets in order,
the first the primary, the others tried when it fails or its circuit breaker is open (the model
client's failover). No rule matching: the employee's own endpoint and its failover chain.

The rule schema and :func:`pick_rule` are pure; :class:`RouteTable` keeps one model client per
rule for the profile it belongs to (built on first use, so a breaker's state and a stream's
self-healing mode carry over between calls).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from runtime.model_config import EndpointConfig
from runtime.types import ModelClient

#: The roles a rule may name: a run's three, a sub-agent's task, the chat endpoint.
RouteRole = Literal["leader", "maker", "verifier", "sub_agent", "chat"]
MAX_RULES = 50
PER_MILLION = Decimal(1_000_000)

Slug = Annotated[str, StringConstraints(pattern=r"^[-a-zA-Z0-9_]{1,100}$")]
Glob = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class AliasRule(BaseModel):
    """One routing rule. Empty ``patterns`` or ``roles``: any."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    patterns: list[Glob] = Field(
        default_factory=list,
        max_length=50,
        description="Pattern keys (shell globs, `nightly-*`); empty: any. A chat or a call "
        "without a pattern matches only rules without patterns.",
    )
    roles: list[RouteRole] = Field(
        default_factory=list, description="Roles the rule applies to; empty: any."
    )
    max_price_per_million_tokens: Decimal | None = Field(
        default=None,
        ge=0,
        max_digits=20,
        decimal_places=6,
        description="Cost ceiling: targets whose input or output price per million tokens is "
        "higher are skipped; a rule left with no target does not match. null: no ceiling.",
    )
    targets: list[Slug] = Field(
        min_length=1,
        max_length=10,
        description="Model endpoint names in order: the first is called, the next ones when it "
        "fails or its circuit breaker is open.",
    )

    def matches(self, *, pattern: str, role: str) -> bool:
        if self.roles and role not in self.roles:
            return False
        if not self.patterns:
            return True
        return bool(pattern) and any(fnmatch.fnmatchcase(pattern, glob) for glob in self.patterns)

    def within_ceiling(self, prices: Mapping[str, tuple[Decimal, Decimal]]) -> list[str]:
        """The targets that exist (in ``prices``: per token prices, as endpoints store them)
        and are priced within the ceiling, in order."""
        ceiling = self.max_price_per_million_tokens
        return [
            name
            for name in self.targets
            if name in prices and (ceiling is None or max(prices[name]) * PER_MILLION <= ceiling)
        ]


RULES_SCHEMA = {
    "type": "array",
    "maxItems": MAX_RULES,
    "items": AliasRule.model_json_schema(),
}


def alias_rule_problems(data: Any) -> list[tuple[tuple[str | int, ...], str]]:
    """Every problem of a rules list, as (path inside the list, detail); [] when it is valid.
    Target names are checked against the endpoints by the model's ``clean``."""
    if not isinstance(data, list):
        return [((), "Expected a list of rules.")]
    if len(data) > MAX_RULES:
        return [((), f"At most {MAX_RULES} rules.")]
    problems: list[tuple[tuple[str | int, ...], str]] = []
    for index, item in enumerate(data):
        try:
            rule = AliasRule.model_validate(item)
        except ValidationError as exc:
            for error in exc.errors():
                problems.append(((index, *error["loc"]), error["msg"]))
            continue
        if len(set(rule.targets)) != len(rule.targets):
            problems.append(((index, "targets"), "Each endpoint may be listed once."))
    return problems


def parse_rules(data: Sequence[Any]) -> tuple[AliasRule, ...]:
    return tuple(AliasRule.model_validate(item) for item in data)


def rule_targets(rules: Sequence[AliasRule]) -> set[str]:
    return {name for rule in rules for name in rule.targets}


def pick_rule(
    rules: Sequence[AliasRule],
    *,
    pattern: str,
    role: str,
    prices: Mapping[str, tuple[Decimal, Decimal]],
) -> tuple[int, list[str]] | None:
    """The first rule (its index) matching the call with a target within its ceiling, and those
    targets in order; None: no rule applies."""
    for index, rule in enumerate(rules):
        if not rule.matches(pattern=pattern, role=role):
            continue
        targets = rule.within_ceiling(prices)
        if targets:
            return index, targets
    return None


@dataclass(frozen=True)
class RouteTarget:
    """What a route needs of one endpoint, read once with the profile."""

    config: EndpointConfig
    vision: bool
    context_window: int
    prices: tuple[Decimal, Decimal]


@dataclass(frozen=True)
class ModelRoute:
    """Where one invocation's model calls go."""

    client: ModelClient
    endpoint_name: str
    vision: bool
    context_window: int
    #: ``alias <name> rule <n>: a → b`` when an alias rule chose the chain; "": the employee's
    #: own endpoint.
    label: str = ""


@dataclass
class RouteTable:
    """An alias's rules with its targets, and one client per rule built on first use."""

    alias: str
    rules: tuple[AliasRule, ...]
    targets: Mapping[str, RouteTarget]
    build_client: Callable[[EndpointConfig], ModelClient]
    _routes: dict[tuple[int, tuple[str, ...]], ModelRoute] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _prices: dict[str, tuple[Decimal, Decimal]] = field(init=False)

    def __post_init__(self) -> None:
        self._prices = {name: target.prices for name, target in self.targets.items()}

    def route(self, *, pattern: str, role: str) -> ModelRoute | None:
        picked = pick_rule(self.rules, pattern=pattern, role=role, prices=self._prices)
        if picked is None:
            return None
        index, names = picked
        key = (index, tuple(names))
        with self._lock:
            known = self._routes.get(key)
            if known is None:
                known = self._routes[key] = self._build(index, names)
        return known

    def _build(self, index: int, names: list[str]) -> ModelRoute:
        chain = [self.targets[name] for name in names]
        config = dataclasses.replace(
            chain[0].config, failover=tuple(target.config for target in chain[1:])
        )
        return ModelRoute(
            client=self.build_client(config),
            endpoint_name=names[0],
            # Any hop may answer: images only when every hop takes them, the smallest window.
            vision=all(target.vision for target in chain),
            context_window=min(target.context_window for target in chain),
            label=f"alias {self.alias} rule {index + 1}: {' → '.join(names)}",
        )
