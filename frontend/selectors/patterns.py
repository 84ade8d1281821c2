"""Read-only queries of the patterns pages."""

from __future__ import annotations

from django.db.models import OuterRef, Subquery
from django.http import Http404

from frontend.selectors.runs import runs_for_table, with_budgets
from loops.models import LoopPattern, LoopRun
from loops.triggers.scheduler import pattern_next_fire_at


def patterns_with_last_run() -> list[LoopPattern]:
    """Every pattern with the status and id of its newest run (``last_run_*``)."""
    newest = LoopRun.objects.filter(pattern=OuterRef("pk")).order_by("-created_at", "-id")
    patterns: list[LoopPattern] = list(
        LoopPattern.objects.select_related("cron_schedule")
        .annotate(
            last_run_status=Subquery(newest.values("status")[:1]),
            last_run_id=Subquery(newest.values("id")[:1]),
        )
        .order_by("key")
    )
    for pattern in patterns:
        pattern.next_fire_at = pattern_next_fire_at(pattern)  # type: ignore[attr-defined]
    return patterns


def pattern_keys() -> list[str]:
    return list(LoopPattern.objects.order_by("key").values_list("key", flat=True))


def pattern_detail(key: str) -> LoopPattern:
    pattern = LoopPattern.objects.select_related("cron_schedule").filter(key=key).first()
    if pattern is None:
        raise Http404(f"There is no pattern {key!r}.")
    pattern.next_fire_at = pattern_next_fire_at(pattern)  # type: ignore[attr-defined]
    return pattern


def pattern_recent_runs(pattern: LoopPattern, limit: int = 10) -> list[LoopRun]:
    runs = runs_for_table().filter(pattern=pattern).order_by("-created_at", "-id")
    return with_budgets(list(runs[:limit]))
