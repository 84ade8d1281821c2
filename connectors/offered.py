"""What the connectors' tool providers share: their tools read from rows at most every
``cache_seconds`` (in a worker thread when asked inside an event loop, where the ORM may not
run), and the shared circuit breaker their calls pass."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

from orchestrator.agents.clients import breaker_default
from orchestrator.dbthreads import OffLoopDb
from runtime.breaker import CircuitBreaker
from runtime.types import ToolSpec


class HasSpec(Protocol):
    @property
    def spec(self) -> ToolSpec: ...


T = TypeVar("T", bound=HasSpec)


class OfferedTools(Generic[T]):
    """Tools by offered name, as ``load`` reads them; a change reaches callers within
    ``cache_seconds`` (at once after :meth:`invalidate`)."""

    def __init__(
        self, load: Callable[[], dict[str, T]], threads: OffLoopDb, cache_seconds: float
    ) -> None:
        self.cache_seconds = cache_seconds
        self._load = load
        self._threads = threads
        self._lock = threading.Lock()
        self._tools: dict[str, T] = {}
        self._loaded_at = float("-inf")
        self._breaker: CircuitBreaker | None = None

    def offered(self) -> dict[str, T]:
        with self._lock:
            if time.monotonic() - self._loaded_at > self.cache_seconds:
                self._tools = self._threads.blocking(self._load)
                self._loaded_at = time.monotonic()
            return self._tools

    def invalidate(self) -> None:
        with self._lock:
            self._loaded_at = float("-inf")

    def breaker(self) -> CircuitBreaker:
        """The process-wide breaker (made on first use: the store is the settings')."""
        if self._breaker is None:
            self._breaker = breaker_default()
        return self._breaker

    def review_gates(self, names: Iterable[str]) -> dict[str, tuple[str, str]]:
        return {}  # the harness plan decides; no remote side imposes a review of its own

    def specs(self) -> list[ToolSpec]:
        return [tool.spec for tool in self.offered().values()]
