"""The durable model-tool loop: one role invocation as a small state machine over the journal.

``ToolLoopInvoker.invoke`` reads the invocation's persisted steps, replays them into the
conversation (re-planning each step's calls, or, for an earlier step whose every call ran,
folding its recorded results; either restores the step count and the repetition counters),
settles whatever the last step left unfinished, and then alternates model steps and
tool calls until the model answers, a limit ends the loop, or a call waits for approval.

Each model step is recorded before its tool calls start, and every tool result before the next
model step starts, so a crash at any point loses at most the work in flight: the next attempt
continues from the journal, never re-runs a finished call, and re-issues a started one with the
same idempotency key. See ``docs/tool-loop.md``.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, TypeVar

from runtime import prompts
from runtime.checkpoint import MIN_ENTRIES, keep_checkpoint, resume_steps
from runtime.compaction import (
    FORCED_KEEP_RECENT_GROUPS,
    KEEP_RECENT_GROUPS,
    Compaction,
    OverflowVerdict,
    compact,
    estimate_tokens,
    judge_overflow,
    message_tokens,
)
from runtime.conversation import Conversation
from runtime.dispatch import Phase, Toolset, plan_step, split_client_calls
from runtime.execution import StepExecutor
from runtime.history import (
    CORRECTION_NOTICE,
    Log,
    ModelEntry,
    NoticeEntry,
    assistant_call,
    assistant_message,
    calls_of,
    read_log,
    settled_step,
    step_messages,
)
from runtime.invocation import (
    InvocationOutcome,
    InvocationRequest,
    NothingToPrepare,
    OutcomeKind,
    StepJournal,
)
from runtime.loop_settings import RECURSION_LIMIT, LoopSettings, cap_label, harness_step_cap
from runtime.model_config import EndpointOverflow
from runtime.model_failures import misreported_overflow, temporarily_unavailable
from runtime.model_images import ImagesRefused, refuse_images
from runtime.output_format import OutputFormat
from runtime.policy import ToolPolicy, without_workdir_tools
from runtime.prompt_template import PromptTemplateError
from runtime.tools.base import Invocation
from runtime.tools.registry import ToolRegistry, tool_schema
from runtime.types import (
    ChatRequest,
    ChatResponse,
    ContextOverflow,
    Message,
    ModelCallFailed,
    ModelClient,
)
from runtime.validation import Invalid, ValidArguments

T = TypeVar("T")

ModelClientFactory = Callable[[str], ModelClient | Awaitable[ModelClient]]
"""Employee username → the model client of that employee's endpoint."""
PolicyProvider = Callable[[InvocationRequest], ToolPolicy | Awaitable[ToolPolicy]]
"""Invocation → the tool policy of its compiled harness (the harness planner's output)."""
PromptProvider = Callable[[InvocationRequest], str | Awaitable[str]]
"""Invocation → system prompt (the employee's prompt, memory context, ...)."""
BoundTools = Collection[str] | Callable[[InvocationRequest], Collection[str]]
"""The tools the invocation's employee binds (or, per invocation, a function giving them)."""

DEFAULT_SETTINGS = LoopSettings()
#: ``LoopSettings`` and the harness step cap live in ``runtime.loop_settings``; imported from here.
__all__ = ["RECURSION_LIMIT", "LoopSettings", "ToolLoopInvoker", "harness_step_cap"]


async def _resolve(value: T | Awaitable[T]) -> T:
    if inspect.isawaitable(value):
        return await value
    return value


class ToolLoopInvoker(NothingToPrepare):
    """The agent runtime's :class:`~.invocation.RoleInvoker`: the model-tool loop.

    Everything it depends on is passed in, so the engine can wire it to Django models (employees,
    endpoints, harness plans) without this module importing them.
    """

    def __init__(
        self,
        *,
        model_clients: ModelClientFactory,
        tools: ToolRegistry,
        policy: PolicyProvider,
        settings: LoopSettings | Callable[[InvocationRequest], LoopSettings] = DEFAULT_SETTINGS,
        system_prompt: PromptProvider = prompts.default_system_prompt,
        bound_tools: BoundTools = (),
        preset_messages: Sequence[Message] = (),
        vision: bool = False,
        endpoint_name: str = "",
        route_label: str = "",
    ) -> None:
        self.model_clients = model_clients
        self.tools = tools
        self.policy = policy
        self.settings = settings
        self.system_prompt = system_prompt
        self.bound_tools = bound_tools
        #: Few-shot messages sent after the system prompt (the employee's ``preset_messages``).
        self.preset_messages = tuple(preset_messages)
        #: Whether the model (endpoint ``endpoint_name``) accepts image content parts.
        self.vision = vision
        self.endpoint_name = endpoint_name
        self.route_label = route_label  # a model alias's rule, recorded on each model step

    def invocation_of(self, request: InvocationRequest) -> Invocation:
        """Who the calls of ``request`` are made by, as every call's ``ToolContext`` carries it."""
        bound = self.bound_tools(request) if callable(self.bound_tools) else self.bound_tools
        return tool_invocation(request, bound)

    async def invoke(
        self, request: InvocationRequest, journal: StepJournal, prepared: Any = None
    ) -> InvocationOutcome:
        """Carry out (or continue) one invocation. LeaseLost and cancellation propagate."""
        settings = (
            self.settings if isinstance(self.settings, LoopSettings) else self.settings(request)
        )
        capped = harness_step_cap(settings, request)
        if isinstance(capped, int):
            layer = (request.harness.get("provenance") or {}).get(RECURSION_LIMIT, "default")
            cap = {"setting": RECURSION_LIMIT, "value": 0, "layer": str(layer)}
            return InvocationOutcome(
                kind=OutcomeKind.FAILED,
                code=f"harness_limit:{RECURSION_LIMIT}",
                reason=f"{cap_label(cap)}: no model step may run",
                output=cap,
            )
        settings = capped
        policy = await _resolve(self.policy(request))
        if request.workdir is None:
            policy = without_workdir_tools(policy, self.tools.specs())
        toolset = Toolset(self.tools, policy)
        run = _Invocation(self, request, journal, toolset, settings)
        try:
            return await run.drive()
        except ModelCallFailed as exc:
            if exc.retryable:
                raise temporarily_unavailable(exc) from exc
            return InvocationOutcome(
                kind=OutcomeKind.FAILED, code="model_unavailable", reason=str(exc)
            )
        except PromptTemplateError as exc:  # before any model call: the prompt is not whole
            return InvocationOutcome(
                kind=OutcomeKind.FAILED, code="prompt_template", reason=f"system prompt: {exc}"
            )
        except ImagesRefused as exc:  # before any model call: nothing is dropped silently
            return InvocationOutcome(
                kind=OutcomeKind.FAILED, code="images_unsupported", reason=str(exc)
            )


#: The :class:`Invocation` a tool call of a request carries (``Invocation.of_request``).
tool_invocation = Invocation.of_request


class _Invocation:
    """One ``invoke`` call: the loop proper."""

    def __init__(
        self,
        owner: ToolLoopInvoker,
        request: InvocationRequest,
        journal: StepJournal,
        toolset: Toolset,
        settings: LoopSettings,
    ) -> None:
        self.owner = owner
        self.request = request
        self.journal = journal
        self.toolset = toolset
        self.settings = settings
        self.output = OutputFormat.of(request)
        self.client: ModelClient | None = None
        #: The conversation the invocation drives (set once its journal is read).
        self.conversation: Conversation | None = None

    async def drive(self) -> InvocationOutcome:
        outcome = await self._drive()
        steps = self.conversation.model_steps if self.conversation else 0
        if outcome.kind == OutcomeKind.NEEDS_APPROVAL and steps > MIN_ENTRIES:
            await keep_checkpoint(self.journal, self.settings.repetition, self.owner)
        return outcome

    async def _drive(self) -> InvocationOutcome:
        records, checkpoint = await resume_steps(self.journal, self.settings.repetition, self.owner)
        log = read_log(records, self.journal.idempotency_key)
        budget = self.settings.context_budget_tokens
        if checkpoint is not None:
            prompt, history = checkpoint.prompt, list(checkpoint.history)
            log.files_written.update(checkpoint.files_written)
        elif log.prompt:
            prompt, history = log.prompt, []
        else:
            prompt, history = await self._fresh_start()
        kept = checkpoint.budget_tokens if checkpoint is not None else None
        used = [b for b in (log.budget_tokens, kept) if b]
        conversation = Conversation(
            prompt=prompt, history=history, budget_tokens=min([*used, budget])
        )
        if checkpoint is not None:
            conversation.model_steps = checkpoint.model_steps
            conversation.repetition = checkpoint.repetition
            conversation.corrections = checkpoint.corrections
            conversation.correcting = checkpoint.correcting
        self.conversation = conversation
        executor = StepExecutor(
            journal=self.journal,
            toolset=self.toolset,
            limits=self.settings.execution_limits(),
            workdir=self.request.workdir,
            files_written=log.files_written,
            invocation=self.owner.invocation_of(self.request),
            endpoint=self.owner,
        )
        step = _Stepper(self, conversation, executor, log)
        # Replay: settled steps only rebuild the conversation; the last one may still have
        # calls without results, which are carried out now (and only those).
        for position, entry in enumerate(log.entries):
            outcome = await step.apply(entry, is_last=position == len(log.entries) - 1)
            if outcome is not None:
                return outcome
        while True:
            entry_or_outcome = await self._model_step(conversation)
            if isinstance(entry_or_outcome, InvocationOutcome):
                return entry_or_outcome
            outcome = await step.apply(entry_or_outcome, is_last=True)
            if outcome is not None:
                return outcome

    async def _fresh_start(self) -> tuple[list[Message], list[Message]]:
        """The prompt (kept whole by compaction) and the history a fresh invocation starts with:
        system prompt, the employee's preset messages and the goal; or, request-scoped, the
        system prompt, the client's leading system messages and the preset messages, with the
        rest of the client's conversation as history."""
        system: Message = {
            "role": "system",
            "content": await _resolve(self.owner.system_prompt(self.request)),
        }
        presets = [dict(message) for message in self.owner.preset_messages]
        chat = self.request.conversation
        if chat is None:
            refuse_images(self.request.inputs, self.owner)
            goal: Message = {"role": "user", "content": prompts.goal_content(self.request)}
            return [system, *presets, goal], []
        head = next((i for i, m in enumerate(chat) if m.get("role") != "system"), len(chat))
        return [system, *chat[:head], *presets], list(chat[head:])

    # --- model steps -------------------------------------------------------------------------

    async def _model_step(self, conversation: Conversation) -> ModelEntry | InvocationOutcome:
        phase = conversation.next_phase(self.settings.max_steps)
        offered = list(self.toolset.offered.values())
        tools = [tool_schema(spec) for spec in offered] if phase.offers_tools else []
        tools += list(self.request.client_tools) if phase.offers_tools else []
        instruction: Message | None = None
        if phase.asks_to_finish:
            text = prompts.finishing_instruction(structured=self.output.structured)
            instruction = {"role": "user", "content": text}
        client = await self._client()
        compaction = await self._compact(conversation, tools, instruction, forced=False)
        # The run's budgets decide whether this call may start at all (RunHalted propagates).
        await self.journal.admit_model_call()
        started = time.monotonic()
        try:
            response = await client.complete(self._chat_request(compaction, tools, instruction))
        except ContextOverflow as exc:
            self._judge_overflow(exc, compaction)
            # Once per step: shrink harder (and for the rest of the invocation), then re-issue.
            conversation.budget_tokens = max(
                min(conversation.budget_tokens, compaction.tokens_after) // 2, 1
            )
            compaction = await self._compact(conversation, tools, instruction, forced=True)
            try:
                response = await client.complete(self._chat_request(compaction, tools, instruction))
            except ContextOverflow as again:
                return self._overflow_failure(compaction, self._judge_overflow(again, compaction))
        return await self._record_model_step(
            conversation,
            phase,
            response,
            compaction,
            [s.name for s in offered if tools],
            duration_ms=int((time.monotonic() - started) * 1000),
        )

    async def _client(self) -> ModelClient:
        if self.client is None:
            factory = self.owner.model_clients(self.request.employee_username)
            self.client = await _resolve(factory)
        return self.client

    async def _compact(
        self,
        conversation: Conversation,
        tools: list[dict[str, Any]],
        instruction: Message | None,
        *,
        forced: bool,
    ) -> Compaction:
        extra = estimate_tokens([], tools) + (message_tokens(instruction) if instruction else 0)
        total = conversation.tokens() + extra
        if not forced and total <= conversation.budget_tokens:
            # What compact() returns when everything fits, without rescanning the history.
            messages = [*conversation.prompt, *conversation.history]
            return Compaction(messages=messages, tokens_before=total, tokens_after=total)
        result = compact(
            [*conversation.prompt, *conversation.history],
            conversation.budget_tokens,
            head=len(conversation.prompt),
            extra_tokens=extra,
            keep_recent=FORCED_KEEP_RECENT_GROUPS if forced else KEEP_RECENT_GROUPS,
        )
        if result.changed or forced:
            await self.journal.event(
                "context.compacted",
                {
                    **result.summary(),
                    "forced": forced,
                    "budget_tokens": conversation.budget_tokens,
                    "model_step": conversation.model_steps + 1,
                },
            )
        return result

    def _chat_request(
        self, compaction: Compaction, tools: list[dict[str, Any]], instruction: Message | None
    ) -> ChatRequest:
        messages = [*compaction.messages, *([instruction] if instruction else [])]
        return ChatRequest(
            messages=messages,
            tools=tools,
            response_format=self.output.response_format,
            json_schema=self.output.schema,
            stream=self.settings.stream,
        )

    def _judge_overflow(self, exc: ContextOverflow, compaction: Compaction) -> OverflowVerdict:
        """The verdict on a provider's overflow answer to a request of ``compaction``'s size;
        one that cannot be true (a request clearly within the window) is a provider fault:
        raises :class:`ModelTemporarilyUnavailable`, so the run retries under its model wait
        bound instead of failing with ``context_overflow``."""
        window = self.settings.context_window_tokens
        if isinstance(exc, EndpointOverflow):
            window = exc.context_window
        verdict = judge_overflow(str(exc), compaction.tokens_after, window)
        if not verdict.real:
            raise misreported_overflow(exc, verdict)
        return verdict

    def _overflow_failure(
        self, compaction: Compaction, verdict: OverflowVerdict
    ) -> InvocationOutcome:
        return InvocationOutcome(
            kind=OutcomeKind.FAILED,
            code="context_overflow",
            reason=(
                "The conversation does not fit the model's context window even after a forced "
                f"compaction (about {compaction.tokens_after:,} tokens were sent; the overflow "
                f"is judged real: {verdict.why})."
            ),
            output=verdict.data(),
        )

    async def _record_model_step(
        self,
        conversation: Conversation,
        phase: Phase,
        response: ChatResponse,
        compaction: Compaction,
        offered: list[str],
        *,
        duration_ms: int,
    ) -> ModelEntry:
        number = conversation.model_steps + 1
        message = assistant_message(response, number, phase)
        request: dict[str, Any] = {
            "step": number,
            "phase": str(phase),
            "budget_tokens": conversation.budget_tokens,
            "tools": offered,
            # The tools listed this turn and their trust tiers (seed 004's LIST_TOOLS).
            "tool_tiers": {
                name: str(spec.effect)
                for name in offered
                if (spec := self.toolset.offered.get(name)) is not None
            },
            "estimated_tokens": compaction.tokens_after,
        }
        if number == 1:
            # The prompt as sent, so a resume (even after the employee's prompt changed)
            # continues the same conversation.
            request["prompt"] = conversation.prompt
        if self.owner.route_label:
            request["route"] = self.owner.route_label
        if compaction.changed:
            request["compaction"] = compaction.summary()
        response_record = {
            "message": message,
            "reasoning_content": response.reasoning_content,
            "finish_reason": response.finish_reason,
            "model": response.model,
            "endpoint": response.endpoint,
        }
        if not phase.offers_tools and response.tool_calls:
            response_record["ignored_tool_calls"] = [c.name for c in response.tool_calls]
        seq = await self.journal.record(
            kind="model",
            name=response.model or "model",
            request=request,
            response=response_record,
            tokens_in=response.usage.prompt_tokens,
            tokens_out=response.usage.completion_tokens,
            cost=response.cost,
            duration_ms=duration_ms,
        )
        names = [str((t.get("function") or {}).get("name")) for t in self.request.client_tools]
        calls, client = split_client_calls(calls_of(message), names, self.toolset.offered)
        return ModelEntry(seq, phase, message, calls, request, client_calls=client)


class _Stepper:
    """Folds persisted or fresh steps into the conversation, acting where results are due."""

    def __init__(
        self, run: _Invocation, conversation: Conversation, executor: StepExecutor, log: Log
    ) -> None:
        self.run = run
        self.conversation = conversation
        self.executor = executor
        self.log = log

    async def apply(
        self, entry: ModelEntry | NoticeEntry, *, is_last: bool
    ) -> InvocationOutcome | None:
        """Fold one step into the conversation; an outcome ends the invocation."""
        conversation = self.conversation
        if isinstance(entry, NoticeEntry):
            conversation.add_notice(entry.name, entry.message)
            return None
        conversation.add_model_message(entry.message)
        if not entry.calls and not entry.client_calls:
            # A final answer; one that was followed by a correction request is history.
            return await self._conclude(entry) if is_last else None
        validated = self.log.validated(entry)
        if not is_last and self._replay_settled(entry, validated):
            return None
        plan = plan_step(
            entry.calls,
            step=entry.seq,
            phase=entry.phase,
            toolset=self.run.toolset,
            state=conversation.repetition,
            limits=self.run.settings.repetition,
            validated=validated,
        )
        conversation.repetition = plan.state
        conversation.finalize = conversation.finalize or plan.finalize or entry.phase is Phase.LAST
        settlement = await self.executor.settle(entry, plan, self.log)
        if settlement.gated:
            return InvocationOutcome(
                kind=OutcomeKind.NEEDS_APPROVAL, output={"gated": settlement.gated}
            )
        answers = [settlement.answer(index) for index in range(len(entry.calls))]
        conversation.history += step_messages(entry.calls, answers, self.run.owner)
        if entry.client_calls:  # the client runs these: its next request carries the results
            handed = [assistant_call(call) for call in entry.client_calls]
            output = {"text": entry.text, "client_tool_calls": handed}
            return InvocationOutcome(kind=OutcomeKind.COMPLETED, output=output)
        return None

    def _replay_settled(self, entry: ModelEntry, validated: dict[int, ValidArguments]) -> bool:
        """Fold an earlier step whose every call ran and has its result (a resume's history)
        without planning it again; False when it is not such a step."""
        settled = settled_step(
            self.log,
            entry,
            validated,
            self.conversation.repetition,
            self.run.settings.repetition,
            self.run.owner,
        )
        if settled is None:
            return False
        self.conversation.repetition = settled.state
        self.conversation.history += settled.messages
        return True

    async def _conclude(self, entry: ModelEntry) -> InvocationOutcome | None:
        outcome = await self._concluded(entry)
        cap = self.run.settings.step_cap
        ran_out = self.conversation.model_steps >= self.run.settings.max_steps
        if outcome is None or outcome.kind != OutcomeKind.FAILED or cap is None or not ran_out:
            return outcome
        # The invocation ran out of the steps the harness allowed, without a usable answer.
        return InvocationOutcome(
            kind=OutcomeKind.FAILED,
            code=f"harness_limit:{RECURSION_LIMIT}",
            reason=(
                f"{cap_label(cap)}: the invocation ran out of model steps after "
                f"{self.conversation.model_steps}; {outcome.reason}"
            ),
            output=dict(cap),
        )

    async def _concluded(self, entry: ModelEntry) -> InvocationOutcome | None:
        output_format = self.run.output
        if not output_format.structured and not entry.text.strip():
            return InvocationOutcome(
                kind=OutcomeKind.FAILED,
                code="empty_answer",
                reason=f"The model gave no answer after {self.conversation.model_steps} steps.",
            )
        output = output_format.parse(entry.text)
        if not isinstance(output, Invalid):
            return InvocationOutcome(kind=OutcomeKind.COMPLETED, output=output)
        if self.conversation.corrections == 0:
            # One chance to fix a malformed structured answer, persisted like any step so a
            # resume sees that it was already asked for.
            notice: Message = {
                "role": "user",
                "content": prompts.correction_request(output.message),
            }
            await self.run.journal.record(
                kind="notice",
                name=CORRECTION_NOTICE,
                request={"model_seq": entry.seq},
                response=notice,
            )
            self.conversation.history.append(notice)
            self.conversation.corrections += 1
            self.conversation.correcting = True
            return None
        return InvocationOutcome(
            kind=OutcomeKind.FAILED,
            code="invalid_output",
            reason=f"The final answer could not be used: {output.message}",
        )
