"""Approvals API: the pending queue across runs and the one decision each approval takes."""

from __future__ import annotations

import uuid

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from loops.models import ActionApproval, ApprovalStatus
from loops.serializers import ApprovalSerializer, DecideSerializer
from loops.services.approvals import approval_check_decider, approval_decide
from orchestrator.accounts.permissions import IsViewer
from orchestrator.accounts.roles import Role, has_role


class ApprovalFilter(django_filters.FilterSet):
    status = django_filters.MultipleChoiceFilter(choices=ApprovalStatus.choices, distinct=False)
    pattern = django_filters.CharFilter(field_name="run__pattern__key")
    run = django_filters.UUIDFilter(field_name="run_id")

    class Meta:
        model = ActionApproval
        fields = ["status", "pattern", "run"]


class ApprovalViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[ActionApproval]
):
    """Gated tool calls, oldest first. Deciding needs the approver role (or being a listed
    approver of the run's pattern)."""

    queryset = ActionApproval.objects.select_related("run__pattern").order_by("created_at")
    serializer_class = ApprovalSerializer
    permission_classes = [IsViewer]
    filterset_class = ApprovalFilter

    def get_object(self) -> ActionApproval:
        self._approval_id()
        return super().get_object()

    def _approval_id(self) -> uuid.UUID:
        try:
            return uuid.UUID(str(self.kwargs.get("pk")))
        except ValueError as exc:
            raise ValidationError({"id": ["Not a valid approval id (a UUID)."]}) from exc

    @extend_schema(
        request=DecideSerializer,
        responses={200: ApprovalSerializer},
        description=(
            "Approve (optionally with edited `input`, validated against the tool's schema and "
            "re-checked against the run's policy) or reject with a `reason`. An approval of "
            "`kind` `input` is a question a running call asked (a remote A2A agent's "
            "`input-required`): `answer` it (the call goes on with the answer, on the same "
            "remote task) or reject it. An approval with a `review_schema` (a reviewed "
            "skill's) is decided only with a `review` valid against it (400 naming the field "
            "otherwise); the model is told the review with the call's result or rejection. "
            "A `review` on an approval without a `review_schema` is refused (400). "
            "`interaction_schema` is the schema of the form to edit `input` with. A second "
            "decision is 409; a user who may not decide gets 403."
        ),
    )
    @action(detail=True, methods=["post"])
    def decide(self, request: Request, pk: str | None = None) -> Response:
        if not has_role(request.user, Role.APPROVER):
            # Maybe one of the run's listed approvers: answered before the body is read.
            approval_check_decider(approval=self.get_object(), user=request.user)
        approval_id = self._approval_id()
        body = DecideSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            decided = approval_decide(
                approval_id=approval_id,
                user=request.user,
                decision=body.validated_data["decision"],
                input=body.validated_data["input"],
                reason=body.validated_data["reason"],
                answer=body.validated_data["answer"],
                review=body.validated_data["review"],
            )
        except ActionApproval.DoesNotExist as exc:
            raise NotFound(f"No approval {approval_id}.") from exc
        return Response(ApprovalSerializer(decided).data)
