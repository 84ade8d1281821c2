"""The invocation contract: what the engine may call on every invoker and journal."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from runtime.invocation import NothingToPrepare, OutcomeKind, UnavailableInvoker
from runtime.scrub import ScrubbingJournal
from tests.support.fake_model import ScriptedModel, make_invoker, make_request, text
from tests.support.journal import MemoryJournal


def test_an_invoker_with_nothing_to_read_prepares_none() -> None:
    journal = MemoryJournal()
    for invoker in (UnavailableInvoker(), make_invoker(ScriptedModel(text("Done.")), [])):
        assert isinstance(invoker, NothingToPrepare)
        assert asyncio.run(invoker.prepare(make_request(), journal)) is None


def test_the_unavailable_invoker_fails_with_its_reason_whatever_was_prepared() -> None:
    outcome = asyncio.run(UnavailableInvoker().invoke(make_request(), MemoryJournal(), None))
    assert (outcome.kind, outcome.code) == (OutcomeKind.FAILED, "no_agent_runtime")


def test_a_scrubbing_journal_runs_db_calls_on_its_inner_journal_threads() -> None:
    threads: list[Any] = []

    def read(value: int) -> int:
        threads.append(threading.current_thread())
        return value + 1

    journal = ScrubbingJournal(MemoryJournal(), ["s3cret-value"])
    assert asyncio.run(journal.db_call(read, 41)) == 42
    assert threads and threads[0] is not threading.main_thread()
