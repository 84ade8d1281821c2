"""Blocks the apps add to an employee's prompt (``runtime.prompt_context``): in registration
order, empty ones left out, a failing provider adding nothing while the others still count."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from runtime import prompt_context
from runtime.invocation import InvocationRequest, LoopRole


class Fixed:
    def __init__(self, text: str) -> None:
        self.text = text

    async def prompt_block(self, request: InvocationRequest) -> str:
        return self.prompt_block_here(request)

    def prompt_block_here(self, request: InvocationRequest) -> str:
        return f"{self.text} for {request.user}" if self.text else ""


class Broken:
    async def prompt_block(self, request: InvocationRequest) -> str:
        raise RuntimeError("the store is down")

    def prompt_block_here(self, request: InvocationRequest) -> str:
        raise RuntimeError("the store is down")


@pytest.fixture
def providers() -> Iterator[list[object]]:
    saved = list(prompt_context._PROVIDERS)
    prompt_context._PROVIDERS.clear()
    yield prompt_context._PROVIDERS  # type: ignore[misc]
    prompt_context._PROVIDERS[:] = saved


def test_blocks_come_in_order_and_a_failing_provider_adds_nothing(
    providers: list[object], caplog: pytest.LogCaptureFixture
) -> None:
    first, second = Fixed("<memo>"), Fixed("<kb>")
    for provider in (first, Broken(), Fixed(""), second, first):  # first twice: once
        prompt_context.prompt_context_register(provider)
    request = InvocationRequest(
        run_id=uuid.uuid4(),
        role=LoopRole.MAKER,
        invocation="maker:0",
        employee_username="ada",
        goal="g",
        harness={},
        user="alice",
    )
    assert asyncio.run(prompt_context.prompt_blocks(request)) == [
        "<memo> for alice",
        "<kb> for alice",
    ]
    # On a database thread already (the chat endpoint's preparation): the same blocks.
    assert prompt_context.prompt_blocks_here(request) == ("<memo> for alice", "<kb> for alice")
    assert "prompt context of Broken failed" in caplog.text
