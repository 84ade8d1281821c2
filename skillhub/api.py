"""REST endpoints of the Skill Hub: thin views over the services (docs/skills.md)."""

from __future__ import annotations

import uuid
from typing import Any

import django_filters
from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from orchestrator.accounts.actors import request_actor
from orchestrator.accounts.permissions import IsOperator, IsViewer, ReadOrOperator
from orchestrator.errors import Conflict, NotFound
from orchestrator.pagination import bounded_int
from orchestrator.sse import EventStreamRenderer
from skillhub.catalog import TEMPLATES
from skillhub.models import (
    TOOL_NAME_PATTERN,
    ExecutionStatus,
    Skill,
    SkillExecution,
    SkillLoopConfig,
)
from skillhub.serializers import (
    ExecutionDetailSerializer,
    ExecutionEventSerializer,
    ExecutionSerializer,
    GitSourceSerializer,
    LoopConfigSerializer,
    McpCallSerializer,
    McpContentSerializer,
    McpToolSerializer,
    SkillSerializer,
    SkillTestSerializer,
    SkillUpdateSerializer,
    TemplateSerializer,
)
from skillhub.services.access import Caller
from skillhub.services.calls import QUEUE_GRACE_SECONDS, mcp_call_tool, mcp_list_tools
from skillhub.services.events import EVENTS_PAGE, events_after
from skillhub.services.executions import execution_request, execution_wait
from skillhub.services.gitimport import git_list_skills, git_sync_skills
from skillhub.services.review import skill_review_save
from skillhub.services.skills import skill_create, skill_delete, skill_update
from skillhub.streams import execution_event_stream

_PROBLEM = OpenApiResponse(description="application/problem+json")
#: One server-sent event of an execution's stream (the schema applies to each event).
_STREAM_EVENT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "event": {"type": "string", "enum": ["event", "done", "bye", "error"]},
        "id": {"type": "string"},
        "data": {"type": "string", "description": "JSON"},
    },
    "required": ["event", "data"],
}


_MAX_SEQ = 2**63 - 1
#: The ``after`` cursor's schema: what :func:`_after` accepts.
_SEQ = {"type": "integer", "minimum": 0, "maximum": _MAX_SEQ}


def _after(value: str | None) -> int:
    """The ``after`` cursor: a sequence number (0 = from the start), within a 64-bit integer."""
    return bounded_int({"after": value}, "after", default=0, low=0, high=_MAX_SEQ)


#: ``tool_name`` in a path: what a skill may be named (the collection's actions, camelCase, never
#: match it).
_TOOL_NAME = OpenApiParameter(
    "tool_name",
    {"type": "string", "pattern": TOOL_NAME_PATTERN},
    OpenApiParameter.PATH,
    description="The skill's tool name.",
)


@extend_schema_view(
    retrieve=extend_schema(parameters=[_TOOL_NAME]),
    update=extend_schema(parameters=[_TOOL_NAME]),
    partial_update=extend_schema(parameters=[_TOOL_NAME]),
    destroy=extend_schema(parameters=[_TOOL_NAME]),
    test=extend_schema(parameters=[_TOOL_NAME]),
    review=extend_schema(parameters=[_TOOL_NAME]),
)
class SkillViewSet(viewsets.ModelViewSet[Skill]):
    """Skill definitions, addressed by their immutable ``tool_name``."""

    queryset = Skill.objects.all()
    serializer_class = SkillSerializer
    permission_classes = [ReadOrOperator]
    lookup_field = "tool_name"
    filterset_fields = ["language", "enabled", "tool_scope", "source"]

    def get_serializer_class(self) -> type[SkillSerializer]:
        if self.action in ("update", "partial_update"):
            return SkillUpdateSerializer
        return SkillSerializer

    def perform_create(self, serializer: SkillSerializer) -> None:  # type: ignore[override]
        serializer.instance = skill_create(
            actor=request_actor(self.request), **serializer.service_fields()
        )

    def perform_update(self, serializer: SkillSerializer) -> None:  # type: ignore[override]
        assert serializer.instance is not None
        serializer.instance = skill_update(
            skill=serializer.instance,
            actor=request_actor(self.request),
            **serializer.service_fields(),
        )

    def perform_destroy(self, instance: Skill) -> None:
        skill_delete(skill=instance)

    @extend_schema(
        request=SkillTestSerializer,
        responses={200: ExecutionDetailSerializer, 202: ExecutionDetailSerializer, 429: _PROBLEM},
        description=(
            "Run the skill once with `inputs` (validated against `input_schema`) and wait for the "
            "result: 200 with the finished execution, 202 when it is still queued or running "
            "after `wait_seconds`. 400 for inputs that do not match, 403 for a disabled skill or "
            "a caller without the operator role, 429 past the per-user rate limit."
        ),
    )
    @action(detail=True, methods=["post"], permission_classes=[IsOperator])
    def test(self, request: Request, tool_name: str | None = None) -> Response:
        skill = self.get_object()
        body = SkillTestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        execution = execution_request(
            skill=skill,
            inputs=body.validated_data["inputs"],
            caller=Caller.for_user(request.user),
            origin="test",
        )
        wait = body.validated_data["wait_seconds"]
        wait = skill.timeout_seconds + QUEUE_GRACE_SECONDS if wait is None else wait
        finished = execution_wait(execution_id=execution.id, timeout=float(wait))
        code = status.HTTP_200_OK if finished.finished else status.HTTP_202_ACCEPTED
        return Response(ExecutionDetailSerializer(finished).data, status=code)

    @extend_schema(responses={200: TemplateSerializer(many=True)})
    @action(
        detail=False,
        methods=["get"],
        url_path="listTemplates",
        permission_classes=[IsViewer],
        pagination_class=None,
        filter_backends=[],
    )
    def list_templates(self, request: Request) -> Response:
        """Starter templates (``listTemplates``): valid skill definitions to copy."""
        return Response(TEMPLATES)

    @extend_schema(responses={200: McpToolSerializer(many=True)})
    @action(
        detail=False,
        methods=["get"],
        url_path="mcpListTools",
        permission_classes=[IsViewer],
        pagination_class=None,
        filter_backends=[],
    )
    def mcp_list_tools(self, request: Request) -> Response:
        """The enabled skills as MCP tools ``{name, description, inputSchema, outputSchema,
        annotations}``."""
        return Response(mcp_list_tools(Caller.for_user(request.user)))

    @extend_schema(
        request=McpCallSerializer,
        responses={
            200: McpContentSerializer,
            400: _PROBLEM,
            403: _PROBLEM,
            404: _PROBLEM,
            429: _PROBLEM,
        },
        description=(
            "Run a skill as an MCP `tools/call` would and return MCP content: the output text and "
            "a manifest of output files; `isError` when the program failed or was killed. 404 "
            "when no skill has that name."
        ),
    )
    @action(detail=False, methods=["post"], url_path="mcpCallTool", permission_classes=[IsOperator])
    def mcp_call_tool(self, request: Request) -> Response:
        body = McpCallSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        result = mcp_call_tool(
            name=body.validated_data["name"],
            arguments=body.validated_data["arguments"],
            caller=Caller.for_user(request.user),
            origin="api",
        )
        return Response(result)

    @extend_schema(
        request=GitSourceSerializer,
        responses={200: OpenApiResponse(description="The skills of the repository")},
        description="Read `skills.json` and each skill's `SKILL.md` front matter (no writes).",
    )
    @action(
        detail=False, methods=["post"], url_path="gitListSkills", permission_classes=[IsOperator]
    )
    def git_list(self, request: Request) -> Response:
        body = GitSourceSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        return Response(git_list_skills(repository=data["repository"], ref=data["ref"]))

    @extend_schema(
        request=GitSourceSerializer,
        responses={200: OpenApiResponse(description="The diff, and what was applied")},
        description=(
            "Compare the repository's skills with the local ones: `create`, `update` (with the "
            "changed fields) and `unchanged`. With `apply: true` the changes are written in one "
            "transaction; with `apply: false` (default) nothing changes."
        ),
    )
    @action(
        detail=False, methods=["post"], url_path="gitSyncSkills", permission_classes=[IsOperator]
    )
    def git_sync(self, request: Request) -> Response:
        body = GitSourceSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        result = git_sync_skills(
            repository=data["repository"], ref=data["ref"], apply=data["apply"],
            actor=request_actor(request),
        )  # fmt: skip
        return Response(result)

    @extend_schema(methods=["get"], responses={200: LoopConfigSerializer})
    @extend_schema(
        methods=["put"], request=LoopConfigSerializer, responses={200: LoopConfigSerializer}
    )
    @action(
        detail=True, methods=["get", "put"], url_path="review", permission_classes=[ReadOrOperator]
    )
    def review(self, request: Request, tool_name: str | None = None) -> Response:
        """The skill's human review template (skillLoopConfigs)."""
        skill = self.get_object()
        config = SkillLoopConfig.objects.filter(skill=skill).first()
        if request.method == "GET":
            if config is None:
                raise NotFound(f"Skill {skill.tool_name!r} has no review configuration.")
            return Response(LoopConfigSerializer(config).data)
        body = LoopConfigSerializer(config, data=request.data)
        body.is_valid(raise_exception=True)
        values = body.validated_data
        saved = skill_review_save(
            skill=skill,
            requires_review=bool(values.get("requires_review", True)),
            review_prompt=str(values.get("review_prompt") or ""),
            review_schema=values.get("review_schema"),
        )
        return Response(LoopConfigSerializer(saved).data)


class ExecutionFilter(django_filters.FilterSet):
    skill = django_filters.CharFilter(field_name="tool_name")
    status = django_filters.MultipleChoiceFilter(choices=ExecutionStatus.choices, distinct=False)

    class Meta:
        model = SkillExecution
        fields = ["skill", "status", "principal", "origin", "run_id"]


class ExecutionViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[SkillExecution]
):
    """Skill executions (read-only) and their output files."""

    queryset = SkillExecution.objects.prefetch_related("output_files").all()
    permission_classes = [IsViewer]
    filterset_class = ExecutionFilter

    def get_serializer_class(self) -> type[ExecutionSerializer]:
        return ExecutionDetailSerializer if self.action == "retrieve" else ExecutionSerializer

    def handle_exception(self, exc: Exception) -> Response:
        """A refusal rendered for an EventSource client (an SSE ``error`` event) says so in
        its content type, not problem+json."""
        response = super().handle_exception(exc)
        if isinstance(getattr(self.request, "accepted_renderer", None), EventStreamRenderer):
            response.content_type = f"{EventStreamRenderer.media_type}; charset=utf-8"
        return response

    def get_object(self) -> SkillExecution:
        try:
            uuid.UUID(str(self.kwargs.get("pk")))
        except ValueError as exc:
            raise ValidationError({"id": ["Not a valid execution id (a UUID)."]}) from exc
        return super().get_object()

    @extend_schema(
        parameters=[OpenApiParameter("name", str, required=True, description="Output file name")],
        responses={
            (200, "application/octet-stream"): OpenApiResponse(description="The file"),
            404: _PROBLEM,
            409: _PROBLEM,
        },
        description=(
            "Download one output file. 409 when the file was over the sandbox's cap (not kept) "
            "or over `LOOPWRIGHT_SKILL_DOWNLOAD_MAX_BYTES`."
        ),
    )
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None)
    def download(self, request: Request, pk: str | None = None) -> Any:
        execution = self.get_object()
        name = request.query_params.get("name", "")
        file = execution.output_files.filter(name=name).first()
        if file is None:
            raise NotFound(f"Execution {execution.id} has no output file {name!r}.")
        limit = int(settings.SKILLHUB["DOWNLOAD_MAX_BYTES"])
        if file.data is None or file.size > limit:
            raise Conflict(
                f"Output file {name!r} ({file.size} bytes) is over the download limit "
                f"({limit} bytes) or was not kept by the sandbox.",
                size=file.size,
                limit=limit,
            )
        response = HttpResponse(bytes(file.data), content_type="application/octet-stream")
        safe = name.replace('"', "").replace("\n", "").rsplit("/", 1)[-1]
        response["Content-Disposition"] = f'attachment; filename="{safe}"'
        response["X-Content-Type-Options"] = "nosniff"
        return response

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "after", _SEQ, required=False, description="Only events with a larger seq (0)."
            )
        ],
        responses={200: ExecutionEventSerializer(many=True), 400: _PROBLEM, 404: _PROBLEM},
        description=(
            "The execution's events in order (`seq` 1, 2, ...): queued, claimed (worker, "
            "attempt), rendering, packages_checked, sandbox_started, progress (bytes of "
            f"stdout/stderr so far and elapsed seconds, about every second), then succeeded, "
            f"failed or timed_out; requeued when the poller recovered it. At most {EVENTS_PAGE} "
            "per answer: ask again with `after` = the last seq."
        ),
    )
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None)
    def events(self, request: Request, pk: str | None = None) -> Response:
        execution = self.get_object()
        after = _after(request.query_params.get("after"))
        events = events_after(execution.id, after)
        return Response(ExecutionEventSerializer(events, many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "after",
                _SEQ,
                required=False,
                description="Start after this seq (or send the `Last-Event-ID` header).",
            )
        ],
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                response=_STREAM_EVENT,
                description="`event: event` per execution event (`id:` its seq, `data:` the "
                "event as JSON), then `event: done` with the final status; the stream ends "
                "when the execution is finished, or after `SSE_MAX_SECONDS` with `event: bye` "
                "(reconnect with `Last-Event-ID`).",
            ),
            400: _PROBLEM,
            404: _PROBLEM,
        },
        description="The execution's events as server-sent events, live while it runs.",
    )
    @action(
        detail=True,
        methods=["get"],
        url_path="events/stream",
        renderer_classes=[JSONRenderer, EventStreamRenderer],
        filter_backends=[],
        pagination_class=None,
    )
    def events_stream(self, request: Request, pk: str | None = None) -> Any:
        execution = self.get_object()
        after = _after(request.headers.get("Last-Event-ID") or request.query_params.get("after"))
        return execution_event_stream(request._request, execution.id, after)
