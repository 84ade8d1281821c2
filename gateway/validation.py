"""Strict validation of a ``POST /v1/chat/completions`` body.

Every field is checked for shape and range, and every refusal is a 400 naming the field
(``param``: ``messages[2].content[0].type``). Fields OpenAI defines that this endpoint does not
act on (``logprobs``, ``seed``, ``stop``, ``n`` > 1, ...) are refused rather than silently
ignored: a client must not believe a setting applied that nothing enforces. ``user`` and
``metadata`` are accepted and recorded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import OpenAIError, bad_request
from orchestrator.jsonlimits import JsonRefused, loads_bounded

MAX_MESSAGES = 2_000
MAX_TOOLS = 128
MAX_OUTPUT_TOKENS = 1_000_000
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

#: OpenAI request fields this endpoint does not act on: refused with a 400 naming them.
NOT_SUPPORTED = frozenset(
    {
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "modalities",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "reasoning_effort",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "top_logprobs",
        "top_p",
        "verbosity",
        "web_search_options",
    }
)
KNOWN = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "temperature",
        "max_tokens",
        "max_completion_tokens",
        "response_format",
        "stream",
        "stream_options",
        "n",
        "store",
        "user",
        "metadata",
    }
)


@dataclass(frozen=True)
class CompletionRequest:
    """A validated chat completion request (the messages exactly as the client sent them)."""

    model: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: Any = None
    temperature: float | None = None
    max_tokens: int | None = None
    response_format: dict[str, Any] | None = None
    stream: bool = False
    include_usage: bool = False
    end_user: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object within the JSON bounds, or a 400."""
    try:
        data = loads_bounded(raw.decode("utf-8"))
    except JsonRefused as exc:
        where = exc.pointer.strip("/").replace("/", ".") or None
        raise bad_request(exc.detail, where, exc.code) from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad_request(f"The body is not valid JSON: {exc}", None, "invalid_json") from exc
    if not isinstance(data, dict):
        raise bad_request("The body must be a JSON object.", None, "invalid_json")
    return data


def _keys(data: dict[str, Any], allowed: set[str] | frozenset[str], where: str) -> None:
    for key in data:
        if key not in allowed:
            raise bad_request(
                f"Unrecognized argument {key!r} in {where}.", f"{where}.{key}", "unknown_parameter"
            )


def _object(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_request(f"{param} must be an object.", param, "invalid_type")
    return value


def _string(value: Any, param: str, *, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise bad_request(f"{param} must be a string.", param, "invalid_type")
    if not empty and not value:
        raise bad_request(f"{param} must not be empty.", param)
    return value


def _text_parts(content: Any, param: str, kinds: frozenset[str]) -> None:
    """``content`` is a string or a non-empty list of parts of the given ``kinds``."""
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not content:
        raise bad_request(
            f"{param} must be a string or a non-empty array of content parts.",
            param,
            "invalid_type",
        )
    for index, part in enumerate(content):
        where = f"{param}[{index}]"
        part = _object(part, where)
        kind = part.get("type")
        if kind not in kinds:
            allowed = ", ".join(sorted(kinds))
            raise bad_request(
                f"{where}.type must be one of: {allowed} (got {kind!r}).", f"{where}.type"
            )
        if kind == "text":
            _keys(part, {"type", "text"}, where)
            _string(part.get("text"), f"{where}.text")
        elif kind == "refusal":
            _keys(part, {"type", "refusal"}, where)
            _string(part.get("refusal"), f"{where}.refusal")
        else:  # image_url: passed through to vision-capable endpoints
            _keys(part, {"type", "image_url"}, where)
            image = _object(part.get("image_url"), f"{where}.image_url")
            _keys(image, {"url", "detail"}, f"{where}.image_url")
            _string(image.get("url"), f"{where}.image_url.url", empty=False)
            if image.get("detail", "auto") not in ("auto", "low", "high"):
                param_name = f"{where}.image_url.detail"
                raise bad_request(f"{param_name} must be auto, low or high.", param_name)


_TEXT = frozenset({"text"})
_USER = frozenset({"text", "image_url"})
_ASSISTANT = frozenset({"text", "refusal"})


def _tool_call(call: Any, param: str) -> None:
    call = _object(call, param)
    _keys(call, {"id", "type", "function"}, param)
    _string(call.get("id"), f"{param}.id", empty=False)
    if call.get("type") != "function":
        raise bad_request(f"{param}.type must be 'function'.", f"{param}.type")
    function = _object(call.get("function"), f"{param}.function")
    _keys(function, {"name", "arguments"}, f"{param}.function")
    _string(function.get("name"), f"{param}.function.name", empty=False)
    _string(function.get("arguments"), f"{param}.function.arguments")


def _assistant(message: dict[str, Any], param: str) -> None:
    known = {"role", "content", "name", "tool_calls", "refusal", "reasoning_content"}
    _keys(message, known, param)
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise bad_request(f"{param}.tool_calls must be an array.", f"{param}.tool_calls")
        for index, call in enumerate(calls):
            _tool_call(call, f"{param}.tool_calls[{index}]")
    content = message.get("content")
    if content is None:
        if not calls:
            raise bad_request(
                f"{param} needs content or tool_calls.", f"{param}.content", "missing"
            )
    else:
        _text_parts(content, f"{param}.content", _ASSISTANT)
    for name in ("refusal", "reasoning_content"):
        if message.get(name) is not None:
            _string(message[name], f"{param}.{name}")


def _message(message: Any, param: str) -> dict[str, Any]:
    message = _object(message, param)
    role = message.get("role")
    if role in ("system", "developer"):
        _keys(message, {"role", "content", "name"}, param)
        _text_parts(message.get("content"), f"{param}.content", _TEXT)
    elif role == "user":
        _keys(message, {"role", "content", "name"}, param)
        _text_parts(message.get("content"), f"{param}.content", _USER)
    elif role == "assistant":
        _assistant(message, param)
    elif role == "tool":
        _keys(message, {"role", "content", "tool_call_id"}, param)
        _string(message.get("tool_call_id"), f"{param}.tool_call_id", empty=False)
        _text_parts(message.get("content"), f"{param}.content", _TEXT)
    else:
        raise bad_request(
            f"{param}.role must be system, developer, user, assistant or tool (got {role!r}).",
            f"{param}.role",
        )
    if "name" in message:
        _string(message["name"], f"{param}.name", empty=False)
    return message


def _messages(value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not value:
        raise bad_request("messages must be a non-empty array.", "messages", "invalid_type")
    if len(value) > MAX_MESSAGES:
        raise bad_request(f"messages holds more than {MAX_MESSAGES} items.", "messages")
    return tuple(_message(item, f"messages[{i}]") for i, item in enumerate(value))


def _tools(value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list):
        raise bad_request("tools must be an array.", "tools", "invalid_type")
    if len(value) > MAX_TOOLS:
        raise bad_request(f"tools holds more than {MAX_TOOLS} items.", "tools")
    names: set[str] = set()
    for index, tool in enumerate(value):
        param = f"tools[{index}]"
        tool = _object(tool, param)
        _keys(tool, {"type", "function"}, param)
        if tool.get("type") != "function":
            raise bad_request(f"{param}.type must be 'function'.", f"{param}.type")
        function = _object(tool.get("function"), f"{param}.function")
        _keys(function, {"name", "description", "parameters", "strict"}, f"{param}.function")
        name = _string(function.get("name"), f"{param}.function.name")
        if not TOOL_NAME.match(name):
            raise bad_request(
                f"{param}.function.name must be 1-64 letters, digits, '_' or '-'.",
                f"{param}.function.name",
            )
        if name in names:
            raise bad_request(f"Two tools are named {name!r}.", f"{param}.function.name")
        names.add(name)
        if "description" in function:
            _string(function["description"], f"{param}.function.description")
        if "parameters" in function:
            _object(function["parameters"], f"{param}.function.parameters")
        if "strict" in function and not isinstance(function["strict"], bool | None):
            raise bad_request(f"{param}.function.strict must be a boolean.", "strict")
    return tuple(value)


def _tool_choice(value: Any, tools: tuple[dict[str, Any], ...]) -> Any:
    if value is None or value in ("none", "auto"):
        return value
    if (value == "required" or isinstance(value, dict)) and not tools:
        raise bad_request("tool_choice needs tools.", "tool_choice")
    if value == "required":
        return value
    if not isinstance(value, dict):
        raise bad_request(
            "tool_choice must be none, auto, required or a named function.", "tool_choice"
        )
    _keys(value, {"type", "function"}, "tool_choice")
    if value.get("type") != "function":
        raise bad_request("tool_choice.type must be 'function'.", "tool_choice.type")
    function = _object(value.get("function"), "tool_choice.function")
    _keys(function, {"name"}, "tool_choice.function")
    name = _string(function.get("name"), "tool_choice.function.name")
    if name not in {tool["function"]["name"] for tool in tools}:
        raise bad_request(f"tool_choice names {name!r}, which is not in tools.", "tool_choice")
    return value


def _response_format(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    value = _object(value, "response_format")
    kind = value.get("type")
    if kind in ("text", "json_object"):
        _keys(value, {"type"}, "response_format")
    elif kind == "json_schema":
        _keys(value, {"type", "json_schema"}, "response_format")
        schema = _object(value.get("json_schema"), "response_format.json_schema")
        where = "response_format.json_schema"
        _keys(schema, {"name", "description", "schema", "strict"}, where)
        name = _string(schema.get("name"), f"{where}.name")
        if not TOOL_NAME.match(name):
            raise bad_request(f"{where}.name must be 1-64 letters, digits, '_' or '-'.", where)
        if "schema" in schema:
            _object(schema["schema"], f"{where}.schema")
    else:
        raise bad_request(
            "response_format.type must be text, json_object or json_schema.",
            "response_format.type",
        )
    return value


def _number(value: Any, param: str, low: float, high: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"{param} must be a number.", param, "invalid_type")
    if not low <= value <= high:
        raise bad_request(f"{param} must be between {low:g} and {high:g}.", param)
    return float(value)


def _max_tokens(data: dict[str, Any]) -> int | None:
    found: dict[str, int] = {}
    for name in ("max_tokens", "max_completion_tokens"):
        value = data.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_request(f"{name} must be an integer.", name, "invalid_type")
        if not 1 <= value <= MAX_OUTPUT_TOKENS:
            raise bad_request(f"{name} must be between 1 and {MAX_OUTPUT_TOKENS}.", name)
        found[name] = value
    if len(set(found.values())) > 1:
        raise bad_request(
            "max_tokens and max_completion_tokens disagree; send one.", "max_completion_tokens"
        )
    return next(iter(found.values()), None)


def _flag(data: dict[str, Any], name: str) -> bool:
    value = data.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be a boolean.", name, "invalid_type")
    return value


def _metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    value = _object(value, "metadata")
    if len(value) > 16:
        raise bad_request("metadata holds at most 16 keys.", "metadata")
    for key, item in value.items():
        if len(key) > 64 or not isinstance(item, str) or len(item) > 512:
            raise bad_request(
                "metadata maps keys of up to 64 characters to strings of up to 512.",
                f"metadata.{key}",
            )
    return dict(value)


def _refuse_unsupported(data: dict[str, Any]) -> None:
    for key in data:
        if key in NOT_SUPPORTED:
            raise bad_request(
                f"{key!r} is not supported by this endpoint (nothing here would act on it); "
                "leave it out.",
                key,
                "unsupported_parameter",
            )
        if key not in KNOWN:
            raise bad_request(
                f"Unrecognized request argument supplied: {key}", key, "unknown_parameter"
            )
    if data.get("n") not in (None, 1):
        raise bad_request("n must be 1: one choice per request.", "n", "unsupported_value")
    if data.get("store") not in (None, False):
        raise bad_request("store is not supported: completions are not stored.", "store")
    if data.get("parallel_tool_calls") not in (None, True):
        raise bad_request(
            "parallel_tool_calls false is not supported: the model decides.",
            "parallel_tool_calls",
            "unsupported_value",
        )


def chat_request(data: dict[str, Any]) -> CompletionRequest:
    """The validated request, or an :class:`OpenAIError` (400) naming the first bad field."""
    _refuse_unsupported(data)
    model = _string(data.get("model"), "model", empty=False)
    messages = _messages(data.get("messages"))
    tools = _tools(data["tools"]) if data.get("tools") is not None else ()
    stream = _flag(data, "stream")
    include_usage = False
    options = data.get("stream_options")
    if options is not None:
        if not stream:
            raise bad_request("stream_options needs stream: true.", "stream_options")
        options = _object(options, "stream_options")
        _keys(options, {"include_usage"}, "stream_options")
        include_usage = _flag(options, "include_usage")
    end_user = data.get("user")
    if end_user is not None and (not isinstance(end_user, str) or len(end_user) > 256):
        raise bad_request("user must be a string of up to 256 characters.", "user")
    return CompletionRequest(
        model=model,
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(data.get("tool_choice"), tools),
        temperature=_number(data.get("temperature"), "temperature", 0.0, 2.0),
        max_tokens=_max_tokens(data),
        response_format=_response_format(data.get("response_format")),
        stream=stream,
        include_usage=include_usage,
        end_user=end_user or "",
        metadata=_metadata(data.get("metadata")),
    )


__all__ = ["CompletionRequest", "OpenAIError", "chat_request", "parse_body"]
