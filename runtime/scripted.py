"""The scripted model: an offline, deterministic model provider driven by a rule script.

It lets the embedded default run a whole loop (leader → maker → verifier) with no API key and
no network. It is a provider like any other: an endpoint with provider ``scripted`` and a script
name. It never pretends to be a real model: its model name is ``loopwright-scripted`` and every
response's ``model`` says which script produced it.

A script is data (validated with pydantic): an ordered list of rules. The first rule whose
``when`` matches the request produces the reply; ``fallback`` answers when none does. Matchers
look at what a real model would see: the system prompt (employees carry a role tag such as
``role:maker``), the last user message, the tool whose result is the last message, and the tools
offered. Replies are text, a JSON value (serialised safely) or tool calls whose arguments are
JSON values. String leaves may use ``${goal}``, ``${last_user}``, ``${last_tool_result}`` and
``${path}`` (the first file path mentioned by the user messages).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from string import Template
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runtime.streaming import TextCallback, emit
from runtime.types import ChatRequest, ChatResponse, Message, ToolCall, Usage

SCRIPTED_MODEL = "loopwright-scripted"
DEFAULT_PATH_PATTERN = r"`(?P<quoted>[^`\s]+)`|(?P<bare>[\w./-]+\.[A-Za-z0-9]{1,8})\b"


class ScriptMatch(BaseModel):
    """Every condition that is set must hold (case-insensitive substring tests)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    system_contains: str | None = None
    last_user_contains: str | None = None
    last_user_matches: str | None = None
    #: The last message is the result of this tool.
    after_tool: str | None = None
    #: True: no tool result in the conversation yet; False: at least one.
    no_tool_results: bool | None = None
    #: The request offers this tool (so a rule never calls a tool the model was not given).
    tool_offered: str | None = None


class ScriptToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ScriptReply(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_alias=True)

    text: str | None = None
    #: A JSON value sent as the text (rendered leaf by leaf, then serialised: never broken JSON).
    json_value: Any = Field(default=None, alias="json")
    tool_calls: list[ScriptToolCall] = Field(default_factory=list)
    reasoning: str = ""

    @model_validator(mode="after")
    def _says_something(self) -> ScriptReply:
        if self.text is None and self.json_value is None and not self.tool_calls:
            raise ValueError("a reply needs text, json or tool_calls")
        return self


class ScriptRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    when: ScriptMatch = Field(default_factory=ScriptMatch)
    reply: ScriptReply


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    path_pattern: str = DEFAULT_PATH_PATTERN
    default_path: str = "README.md"
    rules: list[ScriptRule]
    fallback: ScriptReply


# --- the built-in demo script -------------------------------------------------------------------

DEMO_SCRIPT: dict[str, Any] = {
    "name": "demo",
    "description": (
        "Plays the demo loop: the leader plans one task, the maker reads a file, writes it back "
        "with a line appended and summarises, the verifier passes. Employees select their part "
        "with role:leader / role:maker / role:verifier in their system prompt."
    ),
    "rules": [
        {
            "name": "leader-plan",
            "when": {"system_contains": "role:leader"},
            "reply": {
                "json": {
                    "tasks": [
                        {
                            "title": "Update ${path}",
                            "detail": "Read ${path}, append a short note for this goal and "
                            "save it: ${goal}",
                        }
                    ]
                }
            },
        },
        {
            "name": "maker-summary",
            "when": {"system_contains": "role:maker", "after_tool": "write"},
            "reply": {"text": "Read ${path}, appended a note and wrote it back."},
        },
        {
            "name": "maker-write",
            "when": {
                "system_contains": "role:maker",
                "after_tool": "read",
                "tool_offered": "write",
            },
            "reply": {
                "tool_calls": [
                    {
                        "name": "write",
                        "arguments": {
                            "path": "${path}",
                            "content": "${last_tool_result}\nEdited by the Loopwright scripted "
                            "model.\n",
                        },
                    }
                ]
            },
        },
        {
            "name": "maker-read",
            "when": {
                "system_contains": "role:maker",
                "no_tool_results": True,
                "tool_offered": "read",
            },
            "reply": {"tool_calls": [{"name": "read", "arguments": {"path": "${path}"}}]},
        },
        {
            "name": "maker-without-tools",
            "when": {"system_contains": "role:maker"},
            "reply": {"text": "Scripted maker: nothing more to do for ${path}."},
        },
        {
            "name": "verifier-verdict",
            "when": {"system_contains": "role:verifier"},
            "reply": {
                "json": {
                    "verdict": "pass",
                    "reasons": ["The scripted maker changed ${path} as planned."],
                    "checks": [{"name": "diff-present", "passed": True, "evidence": []}],
                }
            },
        },
    ],
    "fallback": {
        "text": "This is the Loopwright scripted model (offline, script demo): no rule of the "
        "script matches this request."
    },
}

BUILTIN_SCRIPTS: dict[str, dict[str, Any]] = {"demo": DEMO_SCRIPT}


def load_script(name: str) -> Script:
    """A built-in script by name, or a JSON script file by absolute path."""
    if name in BUILTIN_SCRIPTS:
        return Script.model_validate(BUILTIN_SCRIPTS[name])
    path = Path(name)
    if path.is_absolute() and path.suffix == ".json" and path.is_file():
        return Script.model_validate_json(path.read_text())
    raise ValueError(f"unknown script {name!r}: use {sorted(BUILTIN_SCRIPTS)} or a .json path")


# --- matching and rendering ---------------------------------------------------------------------


def _text_of(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _messages_of(request: ChatRequest, role: str) -> list[Message]:
    return [m for m in request.messages if m.get("role") == role]


def _tool_name_of_result(request: ChatRequest, result: Message) -> str:
    """The name of the tool whose call ``result`` answers (looked up by tool_call_id)."""
    call_id = result.get("tool_call_id")
    for message in request.messages:
        for call in message.get("tool_calls") or []:
            if call.get("id") == call_id:
                return str((call.get("function") or {}).get("name", ""))
    return str(result.get("name", ""))


def _offered(request: ChatRequest) -> set[str]:
    return {str((t.get("function") or {}).get("name", "")) for t in request.tools}


def _contains(haystack: str, needle: str | None) -> bool:
    return needle is None or needle.lower() in haystack.lower()


def matches(when: ScriptMatch, request: ChatRequest) -> bool:
    system = "\n".join(_text_of(m) for m in _messages_of(request, "system"))
    users = _messages_of(request, "user")
    last_user = _text_of(users[-1]) if users else ""
    last = request.messages[-1] if request.messages else {}
    after = _tool_name_of_result(request, last) if last.get("role") == "tool" else None
    has_results = bool(_messages_of(request, "tool"))
    checks = (
        _contains(system, when.system_contains),
        _contains(last_user, when.last_user_contains),
        when.last_user_matches is None or re.search(when.last_user_matches, last_user) is not None,
        when.after_tool is None or when.after_tool == after,
        when.no_tool_results is None or when.no_tool_results is not has_results,
        when.tool_offered is None or when.tool_offered in _offered(request),
    )
    return all(checks)


def template_vars(script: Script, request: ChatRequest) -> dict[str, str]:
    users = [_text_of(m) for m in _messages_of(request, "user")]
    tools = _messages_of(request, "tool")
    found = re.search(script.path_pattern, "\n".join(users))
    path = next((g for g in found.groups() if g), "") if found else ""
    return {
        "goal": users[0] if users else "",
        "last_user": users[-1] if users else "",
        "last_tool_result": _text_of(tools[-1]) if tools else "",
        "path": path or script.default_path,
    }


def render(value: Any, variables: dict[str, str]) -> Any:
    """Substitute ``${name}`` in every string leaf of a JSON value (values are not re-scanned)."""
    if isinstance(value, str):
        return Template(value).safe_substitute(variables)
    if isinstance(value, list):
        return [render(item, variables) for item in value]
    if isinstance(value, dict):
        return {key: render(item, variables) for key, item in value.items()}
    return value


def _estimate_tokens(text: str) -> int:
    # About four characters a token: enough for budgets to move visibly in the demo.
    return max(1, len(text) // 4)


class ScriptedModelClient:
    """:class:`ModelClient` that answers from a :class:`Script`, offline and deterministically."""

    def __init__(
        self, script: Script, *, endpoint: str = "scripted", on_text: TextCallback | None = None
    ) -> None:
        self.script = script
        self.endpoint = endpoint
        self.on_text = on_text

    def __repr__(self) -> str:
        return f"<ScriptedModelClient script={self.script.name!r}>"

    @property
    def model_name(self) -> str:
        return f"{SCRIPTED_MODEL} (scripted, offline; script {self.script.name})"

    def pick(self, request: ChatRequest) -> tuple[str, ScriptReply]:
        """(rule name, reply) for the first matching rule, or the fallback."""
        for rule in self.script.rules:
            if matches(rule.when, request):
                return rule.name, rule.reply
        return "fallback", self.script.fallback

    async def complete(
        self, request: ChatRequest, *, on_text: TextCallback | None = None
    ) -> ChatResponse:
        rule, reply = self.pick(request)
        variables = template_vars(self.script, request)
        calls = [
            self._tool_call(request, i, call, variables) for i, call in enumerate(reply.tool_calls)
        ]
        text = self._text(reply, variables)
        if request.stream and not calls:
            await emit(on_text or self.on_text, text)
        prompt = json.dumps(request.messages, default=str)
        return ChatResponse(
            content=text,
            tool_calls=calls,
            reasoning_content=render(reply.reasoning, variables),
            usage=Usage(_estimate_tokens(prompt), _estimate_tokens(text + str(calls))),
            finish_reason="tool_calls" if calls else "stop",
            model=f"{self.model_name} rule {rule}",
            endpoint=self.endpoint,
        )

    @staticmethod
    def _text(reply: ScriptReply, variables: dict[str, str]) -> str:
        if reply.json_value is not None:
            return json.dumps(render(reply.json_value, variables))
        return str(render(reply.text or "", variables))

    @staticmethod
    def _tool_call(
        request: ChatRequest, index: int, call: ScriptToolCall, variables: dict[str, str]
    ) -> ToolCall:
        arguments = json.dumps(render(call.arguments, variables))
        # Deterministic ids: the same conversation always yields the same call ids.
        seed = f"{len(request.messages)}:{index}:{call.name}:{arguments}"
        call_id = "call_" + hashlib.sha256(seed.encode()).hexdigest()[:12]
        return ToolCall(id=call_id, name=call.name, arguments=arguments)
