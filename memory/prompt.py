"""The ``<agent_memory_context>`` block of an employee's system prompt (docs/memory.md).

:class:`MemoryPromptProvider` is a ``runtime.prompt_context`` provider, registered by the app.
Under the role's harness ``memory`` section (``enabled``, ``scopes``, ``maxItems``,
``maxChars``) it gives the items the employee may see for the person the work is for
(``InvocationRequest.user``), and records one ``injected`` use per item: for a run with the run
and invocation, for a chat (``request.conversation`` set) as a chat without a run. The block is
read on a database thread (the ORM may not run in the event loop): a chat's on the web
process's pool that keeps its connections (``orchestrator.dbpool``: no connect on the request
path), a run's on a pool of its own (``orchestrator.dbthreads``).
"""

from __future__ import annotations

import functools

from memory.policy import MemoryPolicy
from memory.services import UseOrigin, agent_actor, memory_inject
from orchestrator.dbpool import db_call
from orchestrator.dbthreads import OffLoopDb
from runtime.invocation import InvocationRequest

_THREADS = OffLoopDb("memory-prompt")


def request_origin(request: InvocationRequest) -> UseOrigin:
    """Who is given the items: the employee, in the run's invocation or in a chat."""
    chat = request.conversation is not None
    return UseOrigin(
        actor=agent_actor(request.employee_username),
        run_id=None if chat else request.run_id,
        invocation=request.invocation,
        chat=chat,
    )


class MemoryPromptProvider:
    """Agent memory's prompt block ("" when the harness turns memory off or nothing fits)."""

    async def prompt_block(self, request: InvocationRequest) -> str:
        inject = functools.partial(self.prompt_block_here, request)
        if request.conversation is not None:
            return await db_call(inject)
        return await _THREADS.run(inject)

    def prompt_block_here(self, request: InvocationRequest) -> str:
        policy = MemoryPolicy.of((request.harness or {}).get("settings"))
        if not policy.enabled or not policy.max_items or not policy.max_chars:
            return ""
        return memory_inject(
            employee=request.employee_username,
            user=request.user,
            scopes=policy.scopes,
            max_items=policy.max_items,
            max_chars=policy.max_chars,
            origin=request_origin(request),
        )


MEMORY_PROMPT = MemoryPromptProvider()
