"""Blocks of context an app adds to an employee's system prompt (agent memory, ...).

An app registers a :class:`PromptContextProvider` once (its ``ready()``); the employee's prompt
(``orchestrator.agents.wiring.employee_system_prompt``) asks each for its block of the
invocation and appends what they give, in registration order. A caller already on a database
thread (the chat endpoint's preparation) reads them there (:func:`prompt_blocks_here`) and hands
them over in ``InvocationRequest.prompt_blocks``, saving the request path a thread hop. A block
is part of the prompt, so the first model step of the invocation records it with the prompt (a
resume replays that prompt, not a fresh block). A provider that fails adds nothing: its failure
is logged, the invocation goes on.
"""

from __future__ import annotations

import logging
from typing import Protocol

from runtime.invocation import InvocationRequest

logger = logging.getLogger(__name__)


class PromptContextProvider(Protocol):
    async def prompt_block(self, request: InvocationRequest) -> str:
        """The block to append for ``request`` ("" for none)."""
        ...

    def prompt_block_here(self, request: InvocationRequest) -> str:
        """:meth:`prompt_block`, on a thread that may use the database."""
        ...


_PROVIDERS: list[PromptContextProvider] = []


def prompt_context_register(provider: PromptContextProvider) -> None:
    """Add ``provider`` to every employee's prompt; an app's ``ready()`` calls it once."""
    if provider not in _PROVIDERS:
        _PROVIDERS.append(provider)


async def prompt_blocks(request: InvocationRequest) -> list[str]:
    """The registered providers' blocks for ``request``, the empty ones left out."""
    blocks = []
    for provider in tuple(_PROVIDERS):
        try:
            block = await provider.prompt_block(request)
        except Exception:
            logger.exception("prompt context of %s failed", type(provider).__name__)
            continue
        if block:
            blocks.append(block)
    return blocks


def prompt_blocks_here(request: InvocationRequest) -> tuple[str, ...]:
    """:func:`prompt_blocks`, read on this thread (one that may use the database)."""
    blocks = []
    for provider in tuple(_PROVIDERS):
        try:
            block = provider.prompt_block_here(request)
        except Exception:
            logger.exception("prompt context of %s failed", type(provider).__name__)
            continue
        if block:
            blocks.append(block)
    return tuple(blocks)
