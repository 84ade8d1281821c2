"""A run's step journal under its employee's daily quotas (``orchestrator.agents.quotas``).

:class:`QuotaJournal` refuses a model call when the employee's quota is used up (a
:class:`~runtime.invocation.BudgetExhausted`: the run stops with a budget stop naming the quota)
and adds what each persisted step used to the employee's day. Everything else is the inner
journal's. The usage is added right after the step is written, in its own statement: a crash
between the two leaves that one call uncounted.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from orchestrator.agents.quotas import EmployeeQuota, quota_charge, quota_spent
from orchestrator.dbthreads import OffLoopDb
from runtime.invocation import BudgetExhausted, StepJournal

_THREADS = OffLoopDb("employee-quotas")


class QuotaJournal:
    def __init__(self, inner: StepJournal, quota: EmployeeQuota) -> None:
        self.inner = inner
        self.quota = quota

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def admit_model_call(self) -> None:
        spent = await _THREADS.run(lambda: quota_spent(self.quota))
        if spent is not None:
            raise BudgetExhausted(
                spent.message(),
                code=spent.code,
                data={"quota": spent.metric, "used": str(spent.used), "limit": str(spent.limit)},
            )
        await self.inner.admit_model_call()

    async def _charge(self, tokens: int, cost: float | Decimal) -> None:
        if tokens or cost:
            username = self.quota.username
            await _THREADS.run(lambda: quota_charge(username, tokens=tokens, cost=cost))

    async def complete(
        self,
        seq: int,
        *,
        response: Any,
        error: str = "",
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost: float = 0.0,
    ) -> None:
        await self.inner.complete(
            seq, response=response, error=error, tokens_in=tokens_in, tokens_out=tokens_out,
            cost=cost,
        )  # fmt: skip
        await self._charge(tokens_in + tokens_out, cost)

    async def record(
        self,
        *,
        kind: str,
        name: str,
        request: dict[str, Any],
        response: Any,
        error: str = "",
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost: float = 0.0,
        duration_ms: int | None = None,
    ) -> int:
        seq = await self.inner.record(
            kind=kind, name=name, request=request, response=response, error=error,
            tokens_in=tokens_in, tokens_out=tokens_out, cost=cost, duration_ms=duration_ms,
        )  # fmt: skip
        await self._charge(tokens_in + tokens_out, cost)
        return seq
