"""The guardrail configuration of an employee (docs/guardrails.md): rules for the input (the
client's messages, before the tool loop) and the output (the answer, whole or streamed).

Validated strictly, camelCase in JSON: unknown keys, wrong types and values out of range are
refused, and :func:`parse_guardrail_config` reports every problem with a JSON Pointer to the
offending field (:class:`GuardrailConfigInvalid`). Regexes are compiled and checked at
validation; a moderation rule's URL passes the outbound guard's static checks and its
``apiKeyEnv`` the secret rule of :mod:`runtime.secrets`. Pure: no Django, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel

from runtime import outbound
from runtime.guardrails_patterns import PII_TYPES, SECRET_TYPES, PiiType, SecretType, regex_problem
from runtime.secrets import current_secret_rule

FailMode = Literal["closed", "open"]
RuleKind = Literal["blocklist", "regex", "max_chars", "pii", "secrets", "moderation"]
RULE_KINDS: tuple[RuleKind, ...] = (
    "blocklist",
    "regex",
    "max_chars",
    "pii",
    "secrets",
    "moderation",
)
MAX_RULES = 32
MAX_WINDOW_CHARS = 65_536
MAX_PATTERN_CHARS = 500
RuleName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")]
Word = Annotated[str, Field(min_length=1, max_length=200, pattern=r"\S")]


class _GuardrailModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        frozen=True,
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
        serialize_by_alias=True,
    )


class _RuleBase(_GuardrailModel):
    name: RuleName = Field(description="Names the rule in decisions; unique within a stage.")
    fail_mode: FailMode = Field(
        "closed", description='"closed": an error in the check blocks; "open": it lets through.'
    )


class BlocklistRule(_RuleBase):
    """Blocks a text containing any of ``words`` (case-insensitive, on word boundaries)."""

    kind: Literal["blocklist"]
    words: list[Word] = Field(min_length=1, max_length=1000)


class RegexRule(_RuleBase):
    """Blocks a text where ``pattern`` (Python ``re`` syntax) matches anywhere."""

    kind: Literal["regex"]
    ignore_case: bool = False  # before pattern: the pattern's validator reads it
    pattern: str = Field(min_length=1, max_length=MAX_PATTERN_CHARS)

    @field_validator("pattern")
    @classmethod
    def _compiles_safely(cls, value: str, info: ValidationInfo) -> str:
        problem = regex_problem(value, bool(info.data.get("ignore_case", False)))
        if problem is not None:
            raise ValueError(f"rule {info.data.get('name', '?')!r}: {problem}")
        return value


class MaxCharsRule(_RuleBase):
    """Blocks a text longer than ``maxChars`` characters."""

    kind: Literal["max_chars"]
    max_chars: int = Field(ge=1, le=10_000_000)


class PiiRule(_RuleBase):
    """Blocks a text containing personal data of the listed ``types``."""

    kind: Literal["pii"]
    types: list[PiiType] = Field(default_factory=lambda: list(PII_TYPES), min_length=1)


class SecretsRule(_RuleBase):
    """Blocks a text containing a credential of the listed ``types``."""

    kind: Literal["secrets"]
    types: list[SecretType] = Field(default_factory=lambda: list(SECRET_TYPES), min_length=1)


class ModerationRule(_RuleBase):
    """Asks an OpenAI-compatible ``/v1/moderations`` endpoint; blocks when it flags the text
    (for one of ``categories`` when they are listed)."""

    kind: Literal["moderation"]
    url: str = Field(min_length=1, max_length=2000, description="The full moderations URL.")
    api_key_env: str = Field("", max_length=200)
    model: str = Field("", max_length=200)
    timeout_ms: int = Field(5000, ge=50, le=60_000)
    categories: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(
        default_factory=list, max_length=100
    )

    @field_validator("url")
    @classmethod
    def _url_allowed(cls, value: str) -> str:
        try:
            outbound.check_url(value, outbound.current_policy())
        except outbound.OutboundRefused as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("api_key_env")
    @classmethod
    def _secret_allowed(cls, value: str) -> str:
        problem = current_secret_rule().check(value, field="apiKeyEnv")
        if problem is not None:
            raise ValueError(problem)
        return value


Rule = Annotated[
    BlocklistRule | RegexRule | MaxCharsRule | PiiRule | SecretsRule | ModerationRule,
    Field(discriminator="kind"),
]
Rules = Annotated[list[Rule], Field(max_length=MAX_RULES)]


class GuardrailConfig(_GuardrailModel):
    """The rules of both stages and how streamed answers are gated (docs/guardrails.md)."""

    input: Rules = Field(default_factory=list)
    output: Rules = Field(default_factory=list)
    stream_window_chars: int = Field(256, ge=0, le=MAX_WINDOW_CHARS)
    #: "window": release all but the last streamWindowChars as the answer streams;
    #: "end": release nothing until the whole answer passed every rule.
    stream_release: Literal["window", "end"] = "window"

    @field_validator("input", "output")
    @classmethod
    def _unique_names(cls, rules: list[Any]) -> list[Any]:
        seen: set[str] = set()
        for rule in rules:
            if rule.name in seen:
                raise ValueError(f"two rules are named {rule.name!r}; names are unique per stage")
            seen.add(rule.name)
        return rules

    @property
    def empty(self) -> bool:
        return not self.input and not self.output

    def to_api(self) -> dict[str, Any]:
        """The stored / API form (camelCase, defaults included)."""
        return self.model_dump(mode="json", by_alias=True)


class GuardrailConfigInvalid(ValueError):
    """A guardrail configuration that does not validate; ``problems`` lists every problem as
    ``{pointer, detail, code}`` and the message names each field."""

    def __init__(self, problems: list[dict[str, str]]) -> None:
        listed = "; ".join(f"{p['pointer'] or '/'}: {p['detail']}" for p in problems)
        super().__init__(f"invalid guardrails: {listed}")
        self.problems = problems


def _pointer(path: Sequence[str | int]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _problem(error: Mapping[str, Any]) -> dict[str, str]:
    loc = list(error["loc"])
    # A discriminated union puts the rule's kind in the path ("/input/0/regex/pattern").
    if len(loc) >= 3 and isinstance(loc[1], int) and loc[2] in RULE_KINDS:
        del loc[2]
    detail, code = str(error["msg"]), str(error["type"])
    if code == "extra_forbidden":
        detail, code = f"unknown key {loc[-1]!r}", "unknown_key"
    elif code == "union_tag_invalid":
        loc.append("kind")
        detail = f"unknown kind {error['ctx']['tag']!r}; one of {', '.join(RULE_KINDS)}"
    elif code == "union_tag_not_found":
        loc.append("kind")
        detail = f"a rule needs a kind: one of {', '.join(RULE_KINDS)}"
    elif code == "value_error":
        detail = detail.removeprefix("Value error, ")
    elif code == "model_type":
        detail = "expected an object"
    return {"pointer": _pointer(loc), "detail": detail, "code": code}


def guardrail_problems(data: Any) -> list[dict[str, str]]:
    """Every problem of ``data`` as a guardrail configuration (empty when valid)."""
    try:
        GuardrailConfig.model_validate(data)
    except ValidationError as exc:
        return [_problem(error) for error in exc.errors(include_url=False)]
    return []


def parse_guardrail_config(data: Any) -> GuardrailConfig:
    """``data`` (the JSON form) as a :class:`GuardrailConfig`; raises
    :class:`GuardrailConfigInvalid` naming every offending field."""
    try:
        return GuardrailConfig.model_validate(data)
    except ValidationError as exc:
        raise GuardrailConfigInvalid([_problem(e) for e in exc.errors(include_url=False)]) from None
