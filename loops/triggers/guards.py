"""Whether a pattern accepts a trigger right now, and if not, why.

Every automatic trigger (cron fires, event deliveries) asks ``trigger_refusal`` before it starts
a run and reports the reason it gets back (a refused cron fire row, an entry of an event
delivery's ``refused`` list). ``run_trigger`` itself refuses a disabled pattern with a 409 too,
so a manual trigger says the same thing.

Concurrency is not a refusal: a pattern at its concurrency limit still accepts triggers, and the
extra runs wait in ``queued`` until a slot frees up (the claim query holds them back).
"""

from __future__ import annotations

from loops.models import LoopPattern
from loops.services.breakers import breaker_refusal
from loops.services.budgets import daily_budget_refusal


def trigger_refusal(pattern: LoopPattern) -> str | None:
    """The reason ``pattern`` refuses a new run now, or None when it accepts one.

    Checked: the pattern is enabled, its daily budget is not used up ("daily budget <metric>
    exhausted (<used>/<limit>); it resets at <time>") and its circuit breaker is not open
    ("circuit breaker open after N consecutive failed runs; retry after <time>", or half-open
    while a probe run decides). ``run_trigger`` refuses the same cases with a 409 in the same
    words, so cron, events and manual triggers agree. Read only: a breaker whose cooldown is
    over is not a refusal (``run_trigger`` starts the probe run).
    """
    if not pattern.enabled:
        return f"Pattern {pattern.key!r} is disabled; enable it to start runs."
    return daily_budget_refusal(pattern) or breaker_refusal(pattern)
