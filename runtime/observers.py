"""What the runtime tells whoever counts its work: model calls and tool calls, as they end.

The runtime knows no metrics library; the platform registers one observer
(``orchestrator.apps``: Prometheus counters, docs/observability.md). Without one, nothing is
told. An observer's methods are called on the hot path: they must be quick and never raise.
"""

from __future__ import annotations

from typing import Protocol


class RuntimeObserver(Protocol):
    """Receives the end of each model call and tool call (labels are bounded names only)."""

    def model_call(self, *, endpoint: str, seconds: float, error: str) -> None:
        """One call to ``endpoint`` (its retries included) ended; ``error`` is the failure's
        kind (``transient``, ``endpoint``, ``circuit_open``, ...), "" when it answered."""
        ...

    def model_error(self, *, endpoint: str, kind: str) -> None:
        """One attempt on ``endpoint`` failed (a retried one counts each time)."""
        ...

    def tool_call(self, *, effect: str, outcome: str, seconds: float) -> None:
        """One tool call ran: the effect its tool declares (``read``, ``write``,
        ``external``) and how it ended (``ok``, ``error``, ``timeout``, ``cancelled``)."""
        ...


class _Unobserved:
    def model_call(self, *, endpoint: str, seconds: float, error: str) -> None:
        return None

    def model_error(self, *, endpoint: str, kind: str) -> None:
        return None

    def tool_call(self, *, effect: str, outcome: str, seconds: float) -> None:
        return None


_observer: RuntimeObserver = _Unobserved()


def runtime_observer_register(observer: RuntimeObserver) -> None:
    """Install the process's observer (replacing the previous one)."""
    global _observer
    _observer = observer


def runtime_observer() -> RuntimeObserver:
    """The installed observer (one that ignores everything when none is)."""
    return _observer
