"""The database breaker store: model endpoints' breaker state in ``EndpointCircuit`` rows.

Used when no Redis is configured (the embedded default). Every transition is one conditional
``UPDATE … WHERE state = … AND probe_owner = …`` whose row count says whether this caller won, so
concurrent workers (threads, processes, machines) agree on who probes without holding a lock.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from asgiref.sync import sync_to_async
from django.db.models import F, Value
from django.db.models.functions import Least
from django.utils import timezone

from orchestrator.agents.models import EndpointCircuit
from runtime.breaker import BreakerSnapshot, BreakerState

T = TypeVar("T")


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def _state(value: str) -> BreakerState:
    try:
        return BreakerState(value)
    except ValueError:
        return BreakerState.CLOSED


Offload = Callable[[Callable[[], Any]], Awaitable[Any]]


class DatabaseBreakerStore:
    """:class:`~runtime.breaker.BreakerStore` over ``EndpointCircuit`` rows.

    ``offload`` runs a blocking ORM call from async code; the default is asgiref's
    ``sync_to_async`` (Django's sync thread). A worker that keeps its own database thread pool
    can pass a function that runs the call there instead.
    """

    def __init__(self, offload: Offload | None = None) -> None:
        self._offload = offload

    def read(self, key: str) -> BreakerSnapshot:
        row = EndpointCircuit.objects.filter(key=key).first()
        if row is None:
            return BreakerSnapshot()
        return BreakerSnapshot(
            state=_state(row.state),
            opened_at=row.opened_at.timestamp() if row.opened_at else None,
            cooldown=float(row.cooldown_seconds),
            failures=row.consecutive_failures,
            probe_owner=row.probe_owner,
            stamp=row.opened_at.isoformat() if row.opened_at else "",
        )

    def claim_probe(self, key: str, *, expected: BreakerSnapshot, token: str, now: float) -> bool:
        rows = EndpointCircuit.objects.filter(
            key=key, state=expected.state.value, probe_owner=expected.probe_owner
        )
        if expected.stamp:
            rows = rows.filter(opened_at=datetime.fromisoformat(expected.stamp))
        else:
            rows = rows.filter(opened_at__isnull=True)
        changed = rows.update(
            state=BreakerState.HALF_OPEN.value,
            probe_owner=token,
            opened_at=_at(now),
            updated_at=timezone.now(),
        )
        return changed == 1

    def trip(self, key: str, *, now: float, cooldown: float) -> bool:
        opened = {
            "state": BreakerState.OPEN.value,
            "opened_at": _at(now),
            "cooldown_seconds": round(cooldown),
            "probe_owner": "",
        }
        _, created = EndpointCircuit.objects.get_or_create(
            key=key, defaults={**opened, "consecutive_failures": 1}
        )
        if created:
            return True
        changed = EndpointCircuit.objects.filter(key=key, state=BreakerState.CLOSED.value).update(
            **opened,
            consecutive_failures=F("consecutive_failures") + 1,
            updated_at=timezone.now(),
        )
        return changed == 1

    def probe_failed(self, key: str, *, token: str, now: float, max_cooldown: float) -> bool:
        changed = EndpointCircuit.objects.filter(
            key=key, state=BreakerState.HALF_OPEN.value, probe_owner=token
        ).update(
            state=BreakerState.OPEN.value,
            opened_at=_at(now),
            cooldown_seconds=Least(F("cooldown_seconds") * 2, Value(round(max_cooldown))),
            consecutive_failures=F("consecutive_failures") + 1,
            probe_owner="",
            updated_at=timezone.now(),
        )
        return changed == 1

    def probe_succeeded(self, key: str, *, token: str, cooldown: float) -> bool:
        changed = EndpointCircuit.objects.filter(
            key=key, state=BreakerState.HALF_OPEN.value, probe_owner=token
        ).update(
            state=BreakerState.CLOSED.value,
            opened_at=None,
            cooldown_seconds=round(cooldown),
            consecutive_failures=0,
            probe_owner="",
            updated_at=timezone.now(),
        )
        return changed == 1

    def count_failure(self, key: str, *, now: float, cooldown: float, threshold: int) -> bool:
        EndpointCircuit.objects.get_or_create(key=key)
        EndpointCircuit.objects.filter(key=key, state=BreakerState.CLOSED.value).update(
            consecutive_failures=F("consecutive_failures") + 1, updated_at=timezone.now()
        )
        # Conditional: of concurrent counters reaching the threshold, one opens it.
        EndpointCircuit.objects.filter(
            key=key, state=BreakerState.CLOSED.value, consecutive_failures__gte=threshold
        ).update(
            state=BreakerState.OPEN.value,
            opened_at=_at(now),
            cooldown_seconds=round(cooldown),
            probe_owner="",
            updated_at=timezone.now(),
        )
        return not EndpointCircuit.objects.filter(key=key, state=BreakerState.CLOSED.value).exists()

    def reset_failures(self, key: str) -> None:
        EndpointCircuit.objects.filter(
            key=key, state=BreakerState.CLOSED.value, consecutive_failures__gt=0
        ).update(consecutive_failures=0, updated_at=timezone.now())

    def clear(self, key: str) -> None:
        """Forget a breaker (operators' reset)."""
        EndpointCircuit.objects.filter(key=key).delete()

    async def run(self, fn: Callable[[], T]) -> T:
        if self._offload is not None:
            return cast(T, await self._offload(fn))
        # thread_sensitive: the ORM's connection handling expects Django's one sync thread.
        return await sync_to_async(fn, thread_sensitive=True)()
