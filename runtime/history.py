"""Reading an invocation's persisted steps back into a conversation (pure).

The journal is the only memory an invocation has across a crash, a lost lease or a park for
approval, so everything the loop needs is derivable from it:

* a ``model`` step holds the assistant message (content, ``tool_calls``) and, in its request,
  the step's phase, context budget and, for the first step, the prompt (system + goal) as sent;
* a ``tool`` step holds one call's result; its request names the model step and call index it
  answers (``model_seq``, ``index``), and its idempotency key is the journal's key for them;
* a ``notice`` step holds a message the loop added to the conversation (a request to correct a
  malformed structured answer).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.dispatch import Phase, replay_settled
from runtime.invocation import StepRecord
from runtime.repetition import RepetitionLimits, RepetitionState
from runtime.tool_images import ImageEndpoint, images_message, not_shown_note
from runtime.types import ChatResponse, Message, ToolCall
from runtime.validation import ValidArguments

STARTED = "started"
GATED = "gated"
APPROVED = "approved"
FINISHED = frozenset({"completed", "failed"})
#: The notice asking the model to correct a malformed structured answer.
CORRECTION_NOTICE = "output_correction"


@dataclass(frozen=True)
class ModelEntry:
    seq: int
    phase: Phase
    message: Message
    calls: list[ToolCall]
    request: dict[str, Any]
    #: Calls of tools the client runs (a request-scoped invocation): never planned nor run
    #: here; the invocation ends with them once ``calls`` (the server's) have their results.
    client_calls: list[ToolCall] = field(default_factory=list)

    @property
    def text(self) -> str:
        content = self.message.get("content")
        return content if isinstance(content, str) else ""


@dataclass(frozen=True)
class NoticeEntry:
    seq: int
    name: str
    message: Message


Entry = ModelEntry | NoticeEntry


@dataclass
class Log:
    entries: list[Entry] = field(default_factory=list)
    #: (model step seq, call index) → the latest tool step answering that call.
    results: dict[tuple[int, int], StepRecord] = field(default_factory=dict)
    files_written: set[str] = field(default_factory=set)

    @property
    def model_entries(self) -> list[ModelEntry]:
        return [entry for entry in self.entries if isinstance(entry, ModelEntry)]

    @property
    def prompt(self) -> list[Message] | None:
        """The system prompt and goal exactly as the first model step sent them."""
        first = next(iter(self.model_entries), None)
        prompt = first.request.get("prompt") if first else None
        return list(prompt) if isinstance(prompt, list) else None

    @property
    def budget_tokens(self) -> int | None:
        """The smallest context budget a step used (a forced compaction lowers it for good)."""
        return smallest_budget(self.model_entries)

    def result(self, model_seq: int, index: int) -> StepRecord | None:
        return self.results.get((model_seq, index))

    def validated(self, entry: ModelEntry) -> dict[int, ValidArguments]:
        """The arguments of ``entry``'s calls as they were validated when the step was first
        planned, for the calls whose persisted result records them: a call that ran (and was
        not approved, as an approval may edit the arguments), whose request carries them."""
        known: dict[int, ValidArguments] = {}
        for index in range(len(entry.calls)):
            record = self.results.get((entry.seq, index))
            if record is None or record.status not in FINISHED:
                continue
            request = record.request
            arguments = request.get("arguments")
            if (
                request.get("disposition") == "run"
                and "approval_id" not in request
                and isinstance(arguments, dict)
            ):
                repairs = request.get("repairs")
                known[index] = ValidArguments(
                    arguments, tuple(repairs) if isinstance(repairs, list) else ()
                )
        return known


# --- messages in wire shape ----------------------------------------------------------------


def assistant_message(response: ChatResponse, step_number: int, phase: Phase) -> Message:
    """The assistant message to persist and replay. Tool-call ids are made unique (some
    providers send none or repeat them) because results are linked to calls by id; calls made
    in the final, tool-less step are left out, as nothing will answer them."""
    message: Message = {"role": "assistant", "content": response.content}
    if response.tool_calls and phase.offers_tools:
        seen: set[str] = set()
        calls = []
        for index, call in enumerate(response.tool_calls):
            call_id = call.id if call.id and call.id not in seen else f"call_{step_number}_{index}"
            seen.add(call_id)
            calls.append(assistant_call(ToolCall(call_id, call.name, call.arguments)))
        message["tool_calls"] = calls
        message["content"] = response.content or None
    return message


def assistant_call(call: ToolCall) -> dict[str, Any]:
    """``call`` as an assistant message's ``tool_calls`` entry (OpenAI wire shape)."""
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def calls_of(message: Message) -> list[ToolCall]:
    return [
        ToolCall(
            id=str(call.get("id", "")),
            name=str(call.get("function", {}).get("name", "")),
            arguments=str(call.get("function", {}).get("arguments", "")),
        )
        for call in message.get("tool_calls") or []
    ]


def tool_message(call: ToolCall, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call.id, "content": content}


#: A call's result as the loop folds it: its text and its images (data URLs).
Answer = tuple[str, tuple[str, ...]]


def step_messages(
    calls: list[ToolCall], answers: list[Answer], endpoint: ImageEndpoint
) -> list[Message]:
    """The tool messages of a step's calls (in call order) and, when some result has images and
    ``endpoint`` accepts them, one ``user`` message carrying them after the tool messages;
    an endpoint that does not gets a note in place of the images."""
    messages: list[Message] = []
    shown: list[tuple[ToolCall, tuple[str, ...]]] = []
    for call, (content, images) in zip(calls, answers, strict=True):
        if images and not endpoint.vision:  # the vision setting changed since the call ran
            content = f"{content}\n\n{not_shown_note(len(images), endpoint.endpoint_name)}"
        elif images:
            shown.append((call, images))
        messages.append(tool_message(call, content))
    return [*messages, images_message(shown)] if shown else messages


def result_text(record: StepRecord) -> str:
    """What the model sees for a finished tool step, whoever finished it.

    The loop writes ``{"content": ...}``. A human decision (rejection, approval timeout) may
    be a plain string or an object with ``content``, ``reason`` or ``message``; anything else
    is shown as JSON.
    """
    response = record.response
    if isinstance(response, str):
        return response
    if isinstance(response, dict):
        for key in ("content", "reason", "message"):
            if isinstance(response.get(key), str):
                return str(response[key])
    if response is None:
        return f"Error: {record.error}" if record.error else "[no result was recorded]"
    return json.dumps(response, ensure_ascii=False, default=str)


def result_images(record: StepRecord) -> tuple[str, ...]:
    """The images a finished tool step recorded (``response["images"]``); () when none."""
    response = record.response if isinstance(record.response, dict) else {}
    images = response.get("images")
    return tuple(i for i in images if isinstance(i, str)) if isinstance(images, list) else ()


# --- reading the journal ---------------------------------------------------------------------


def _model_entry(record: StepRecord) -> ModelEntry | None:
    response = record.response if isinstance(record.response, dict) else {}
    message = response.get("message")
    if record.status not in FINISHED or record.error or not isinstance(message, dict):
        return None  # a model call that failed produced no message to replay
    try:
        phase = Phase(record.request.get("phase", Phase.NORMAL))
    except ValueError:
        phase = Phase.NORMAL
    return ModelEntry(record.seq, phase, dict(message), calls_of(message), dict(record.request))


def _notice_entry(record: StepRecord) -> NoticeEntry | None:
    message = record.response
    if isinstance(message, dict) and message.get("role") and "content" in message:
        return NoticeEntry(record.seq, record.name, dict(message))
    return None


def _slot_of(record: StepRecord, keys: dict[str, tuple[int, int]]) -> tuple[int, int] | None:
    model_seq, index = record.request.get("model_seq"), record.request.get("index")
    if isinstance(model_seq, int) and isinstance(index, int):
        return model_seq, index
    # An approval may rewrite the request; the idempotency key still names the call.
    return keys.get(record.idempotency_key)


def read_log(steps: list[StepRecord], key_for: Callable[[int, int], str]) -> Log:
    """Rebuild the log of one invocation from its persisted steps (in seq order)."""
    log = Log()
    keys: dict[str, tuple[int, int]] = {}
    for record in sorted(steps, key=lambda r: r.seq):
        if record.kind == "model":
            entry = _model_entry(record)
            if entry:
                log.entries.append(entry)
                keys.update(
                    {key_for(entry.seq, i): (entry.seq, i) for i in range(len(entry.calls))}
                )
        elif record.kind == "notice":
            notice = _notice_entry(record)
            if notice:
                log.entries.append(notice)
        elif record.kind == "tool":
            slot = _slot_of(record, keys)
            if slot:
                log.results[slot] = record
            log.files_written.update(files_written_by(record))
    return log


def smallest_budget(entries: list[ModelEntry]) -> int | None:
    """The smallest context budget ``entries`` recorded (None: none recorded one)."""
    budgets = [entry.request.get("budget_tokens") for entry in entries]
    return min((b for b in budgets if isinstance(b, int)), default=None)


def files_written_by(record: StepRecord) -> list[str]:
    """The workspace files a finished tool step says it wrote."""
    if record.kind != "tool" or record.status not in FINISHED:
        return []
    response = record.response if isinstance(record.response, dict) else {}
    return list(response.get("files_written") or ())


# --- a settled step folded without planning --------------------------------------------------


@dataclass(frozen=True)
class SettledStep:
    """What folding a settled step adds: the repetition state after its calls, and the tool
    messages (and images message) that follow its assistant message."""

    state: RepetitionState
    messages: list[Message]
    images: bool


def settled_step(
    log: Log,
    entry: ModelEntry,
    validated: dict[int, ValidArguments],
    state: RepetitionState,
    limits: RepetitionLimits,
    endpoint: ImageEndpoint,
) -> SettledStep | None:
    """``entry`` folded from its results (``validated``: ``log.validated(entry)``), for an
    earlier step whose every call ran with its validated arguments (a resume's history, a
    checkpoint); None when it is not such a step (the caller then plans it in full)."""
    if entry.phase is not Phase.NORMAL or len(validated) != len(entry.calls):
        return None
    # Every call is validated, so every call has its finished result.
    records = [log.results[(entry.seq, index)] for index in range(len(entry.calls))]
    after = replay_settled(
        [(record.name, validated[index]) for index, record in enumerate(records)],
        step=entry.seq,
        state=state,
        limits=limits,
    )
    if after is None:
        return None
    answers = [(result_text(record), result_images(record)) for record in records]
    messages = step_messages(entry.calls, answers, endpoint)
    return SettledStep(after, messages, any(images for _, images in answers))
