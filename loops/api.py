"""REST endpoints for patterns and runs: thin views over the services."""

from __future__ import annotations

import uuid
from typing import Any

import django_filters
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from loops import state
from loops.models import LoopPattern, LoopRun, RunStatus
from loops.policy import parse_policy
from loops.serializers import (
    ActionSerializer,
    ArtifactSerializer,
    BudgetRaiseSerializer,
    EventSerializer,
    HarnessPreviewResultSerializer,
    HarnessPreviewSerializer,
    PatternSerializer,
    PatternUpdateSerializer,
    RunDetailSerializer,
    RunSerializer,
    StepSerializer,
    TriggeredRunSerializer,
    TriggerSerializer,
    triggered_run_data,
)
from loops.serializers_spans import SpanTreeSerializer
from loops.services.budgets import run_budget_raise
from loops.services.patterns import pattern_create, pattern_update
from loops.services.runs import role_harness_compile, run_act, run_retry, run_trigger
from loops.services.spans import run_spans
from loops.spans import span_tree
from orchestrator.accounts.actors import request_actor
from orchestrator.accounts.permissions import IsOperator, IsViewer, ReadOrOperator
from orchestrator.errors import Conflict
from orchestrator.pagination import bounded_int

#: The largest event seq a query may name (a 64-bit integer column).
MAX_SEQ = 2**63 - 1


class PatternViewSet(viewsets.ModelViewSet[LoopPattern]):
    """Loop patterns, addressed by their ``key``."""

    queryset = LoopPattern.objects.select_related("cron_schedule").all()
    serializer_class = PatternSerializer
    permission_classes = [ReadOrOperator]
    lookup_field = "key"
    filterset_fields = ["trigger_type", "enabled", "autonomy_level"]

    def get_serializer_class(self) -> type[PatternSerializer]:
        if self.action in ("update", "partial_update"):
            return PatternUpdateSerializer
        return PatternSerializer

    def perform_create(self, serializer: PatternSerializer) -> None:  # type: ignore[override]
        data = dict(serializer.validated_data)
        serializer.instance = pattern_create(actor=request_actor(self.request), **data)

    def perform_update(self, serializer: PatternSerializer) -> None:  # type: ignore[override]
        assert serializer.instance is not None
        serializer.instance = pattern_update(
            pattern=serializer.instance, **dict(serializer.validated_data)
        )

    def perform_destroy(self, instance: LoopPattern) -> None:
        if instance.runs.exists():
            raise Conflict(
                f"Pattern {instance.key!r} has runs and cannot be deleted; disable it instead."
            )
        instance.delete()

    @extend_schema(
        request=TriggerSerializer,
        responses={201: TriggeredRunSerializer},
        description=(
            "Start a run now. `harness_overrides` is the run's own harness layer; what it asks "
            "for beyond an earlier layer is not applied and listed in `harness_notices` (and in "
            "the `run.created` event as `overrides_not_applied`). 400 (problem+json, pointers "
            "`/harness_overrides/...`) for invalid overrides; 409 for a disabled pattern, a "
            "spent daily budget or an open breaker."
        ),
    )
    @action(detail=True, methods=["post"], permission_classes=[IsOperator], filter_backends=[])
    def trigger(self, request: Request, key: str | None = None) -> Response:
        """Start a run of this pattern now, with optional ``inputs`` for the goal template."""
        pattern = self.get_object()
        body = TriggerSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = run_trigger(
            pattern=pattern,
            actor=request_actor(request),
            inputs=body.validated_data["inputs"],
            harness_overrides=body.validated_data.get("harness_overrides"),
        )
        return Response(triggered_run_data(run), status=status.HTTP_201_CREATED)

    @extend_schema(
        request=HarnessPreviewSerializer,
        responses={200: HarnessPreviewResultSerializer},
        description=(
            "The harness snapshots a run triggered now with these overrides would pin, per role, "
            "computed by the same function as a trigger (equal byte for byte), and the "
            "overrides' notices. Changes nothing: open to every role."
        ),
    )
    @action(
        detail=True, methods=["post"], url_path="harness-preview", permission_classes=[IsViewer]
    )
    def harness_preview(self, request: Request, key: str | None = None) -> Response:
        """Preview the per-role harness snapshots of a run triggered now."""
        pattern = self.get_object()
        body = HarnessPreviewSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        harness = role_harness_compile(
            pattern, parse_policy(pattern.policy), body.validated_data.get("harness_overrides")
        )
        return Response(
            {"harness_snapshots": harness.snapshots, "harness_notices": harness.notices}
        )


class RunFilter(django_filters.FilterSet):
    pattern = django_filters.CharFilter(field_name="pattern__key")
    # distinct=False: a filter on the row's own column needs no DISTINCT (which made the list's
    # count compare every column of every matching row).
    status = django_filters.MultipleChoiceFilter(choices=RunStatus.choices, distinct=False)
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = LoopRun
        fields = ["pattern", "status", "trigger_type", "created_after", "created_before"]


def _action_view(name: str) -> Any:
    def view(self: RunViewSet, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        body = ActionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        updated = run_act(
            run_id=run.id,
            action=name,
            actor=request_actor(request),
            reason=body.validated_data["reason"],
        )
        return Response(RunSerializer(updated).data)

    # DRF maps the HTTP method to the function's name, so name it before decorating.
    view.__name__ = view.__qualname__ = name
    view.__doc__ = f"Human action `{name}` on a run."
    decorated = action(
        detail=True, methods=["post"], url_path=name, url_name=name, permission_classes=[IsOperator]
    )(view)
    return extend_schema(
        request=ActionSerializer,
        responses={200: RunSerializer},
        description=(
            f"Human action `{name}`. 409 (problem+json with `current_status` and "
            "`allowed_actions`) when the run's state does not allow it."
        ),
    )(decorated)


#: Run and pattern columns a runs list row never reads (``RunSerializer``).
LIST_DEFERRED = (
    "harness_snapshots",
    "policy_snapshot",
    "repository_snapshot",
    "pattern__description",
    "pattern__goal_template",
    "pattern__policy",
    "pattern__acting_on",
)


class RunViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[LoopRun]
):
    """Runs (read-only), their events and steps, and the human actions on them."""

    queryset = LoopRun.objects.select_related("pattern").all()
    permission_classes = [ReadOrOperator]
    filterset_class = RunFilter

    def get_serializer_class(self) -> type[RunSerializer]:
        return RunDetailSerializer if self.action == "retrieve" else RunSerializer

    def get_queryset(self) -> QuerySet[LoopRun]:
        queryset = super().get_queryset()
        if self.action == "list":
            # What a list row does not show: the pinned snapshots (kilobytes of JSON a run) and
            # the pattern's own texts (only its key is shown).
            queryset = queryset.defer(*LIST_DEFERRED)
        return queryset

    def get_object(self) -> LoopRun:
        try:
            uuid.UUID(str(self.kwargs.get("pk")))
        except ValueError as exc:
            raise ValidationError({"id": ["Not a valid run id (a UUID)."]}) from exc
        return super().get_object()

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "after_seq",
                {"type": "integer", "minimum": 0, "maximum": MAX_SEQ},
                description="Only events after this seq.",
            )
        ],
        responses={200: EventSerializer(many=True)},
    )
    @action(detail=True, methods=["get"], filter_backends=[])
    def events(self, request: Request, pk: str | None = None) -> Response:
        """The run's event history in order (``after_seq`` to page or to follow live); of a run
        whose events were pruned (``events_pruned_at``), only ``run.created``."""
        run = self.get_object()
        after = bounded_int(request.query_params, "after_seq", default=0, low=0, high=MAX_SEQ)
        events: QuerySet[Any] = run.events.filter(seq__gt=after).order_by("seq")
        page = self.paginate_queryset(events)
        return self.get_paginated_response(EventSerializer(page, many=True).data)

    @extend_schema(responses={200: StepSerializer(many=True)})
    @action(detail=True, methods=["get"], filter_backends=[])
    def steps(self, request: Request, pk: str | None = None) -> Response:
        """The run's persisted model and tool steps in order."""
        run = self.get_object()
        steps: QuerySet[Any] = run.steps.order_by("seq")
        page = self.paginate_queryset(steps)
        return self.get_paginated_response(StepSerializer(page, many=True).data)

    @extend_schema(
        responses={200: SpanTreeSerializer},
        description="The run's span tree (docs/observability.md): run, role invocations, model "
        "and tool calls, approval waits, sub-agents; with times, tokens, cost and tiers.",
    )
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None)
    def spans(self, request: Request, pk: str | None = None) -> Response:
        """The run's spans as one tree."""
        found = run_spans(self.get_object())
        body = {
            "run": found.run_id,
            "trace_id": found.trace_id,
            "origin": found.origin,
            "spans": span_tree(found.spans),
        }
        return Response(SpanTreeSerializer(body).data)

    @extend_schema(responses={200: ArtifactSerializer(many=True)})
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None)
    def artifacts(self, request: Request, pk: str | None = None) -> Response:
        """The run's artifacts (the makers' diff, reports) in creation order."""
        run = self.get_object()
        return Response(ArtifactSerializer(run.artifacts.order_by("created_at"), many=True).data)

    @extend_schema(request=None, responses={201: TriggeredRunSerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsOperator])
    def retry(self, request: Request, pk: str | None = None) -> Response:
        """Start a new run with the same inputs and harness overrides (only for failed or
        canceled runs)."""
        run = self.get_object()
        new_run = run_retry(run_id=run.id, actor=request_actor(request))
        return Response(triggered_run_data(new_run), status=status.HTTP_201_CREATED)

    @extend_schema(
        request=BudgetRaiseSerializer,
        responses={200: RunDetailSerializer},
        description=(
            "Raise the run's own budget (merged into its policy snapshot, event `budget.raised`); "
            "a blocked run then continues with `resume`. Only raising is allowed (400 otherwise); "
            "409 for a finished run. Daily budgets belong to the pattern: update its policy."
        ),
    )
    @action(detail=True, methods=["post"], permission_classes=[IsOperator])
    def budget(self, request: Request, pk: str | None = None) -> Response:
        """Raise the run's per-run budget limits."""
        run = self.get_object()
        body = BudgetRaiseSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        updated = run_budget_raise(
            run_id=run.id, per_run=body.validated_data["perRun"], actor=request_actor(request)
        )
        return Response(RunDetailSerializer(updated).data)

    pause = _action_view("pause")
    resume = _action_view("resume")
    cancel = _action_view("cancel")
    escalate = _action_view("escalate")
    accept = _action_view("accept")


assert set(state.HUMAN_ACTIONS) == {"pause", "resume", "cancel", "escalate", "accept"}
