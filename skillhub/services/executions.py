"""Skill executions: request (validate, check, rate-limit, render, enqueue), claim with a lease,
run in the sandbox, store the result fenced by the lease token, and recover dead workers' work.

The row is the work item; the Celery message on the ``skills`` queue is only a wake-up call,
sent after the creating transaction commits. A worker claims the row with a conditional
``UPDATE`` (``FOR UPDATE SKIP LOCKED`` on PostgreSQL) that sets owner, expiry and a new token;
the result is written only ``WHERE lease_token = <its token>``, so a worker whose lease was
taken over writes nothing (``skillhub.services.results``: a write that cannot fail on content,
and a result that still cannot be stored fails the execution once, never re-run). The poller
(``skillhub.recover``) puts executions whose lease expired (a dead worker) back in the queue,
up to ``max_attempts``, then fails them with the reason.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
import time
import uuid
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from jsonschema import Draft202012Validator

from orchestrator import sql
from orchestrator.errors import InvalidInput
from orchestrator.metrics import SKILL_EXECUTIONS
from orchestrator.queue import enqueue
from runtime.egress_proxy import run_restricted
from sandbox import (
    Language,
    MiB,
    Network,
    OutputMeter,
    SandboxError,
    SandboxLimits,
    SandboxRequest,
    SandboxResult,
    run_sandboxed,
)
from skillhub.models import (
    ExecutionEventType,
    ExecutionStatus,
    Skill,
    SkillExecution,
    SkillSource,
)
from skillhub.render import render, with_defaults
from skillhub.services.access import (
    Caller,
    SkillRateLimited,
    skill_access_check,
    skill_allowed_hosts,
    skill_network,
)
from skillhub.services.envbuild import EnvBuildError
from skillhub.services.environments import execution_environment
from skillhub.services.events import event_append
from skillhub.services.localdir import LocalCopy, local_dir_files
from skillhub.services.results import (
    ExecutionLease,
    execution_fail,
    execution_store,
    storable,
)
from skillhub.services.s3source import s3_files
from skillhub.services.skills import nul_pointers

logger = logging.getLogger(__name__)
_TABLE = SkillExecution._meta.db_table


def _setting(name: str) -> Any:
    return settings.SKILLHUB[name]


# --- request ---------------------------------------------------------------------------------


def inputs_validate(skill: Skill, inputs: Any) -> dict[str, Any]:
    """The inputs with schema defaults, or InvalidInput with a pointer per problem."""
    if not isinstance(inputs, dict):
        raise InvalidInput("inputs must be a JSON object", errors=[_input_err([], "not an object")])
    nul = nul_pointers(inputs, "/inputs")
    if nul:
        errors = [{"pointer": p, "detail": "may not contain NUL characters (U+0000)",
                   "code": "invalid"} for p in nul]  # fmt: skip
        raise InvalidInput(
            f"inputs may not contain NUL characters (U+0000): {nul[0]}", errors=errors
        )
    validator = Draft202012Validator(skill.input_schema)
    problems = sorted(validator.iter_errors(inputs), key=lambda e: list(e.absolute_path))
    if problems:
        errors = [_input_err(list(p.absolute_path), p.message) for p in problems[:20]]
        raise InvalidInput(
            f"inputs do not match the input_schema of {skill.tool_name!r}: {problems[0].message}",
            errors=errors,
        )
    return with_defaults(skill.input_schema, inputs)


def _input_err(path: list[Any], detail: str) -> dict[str, str]:
    pointer = "/inputs" + "".join(f"/{p}" for p in path)
    return {"pointer": pointer, "detail": detail, "code": "schema"}


def _rate_check(principal: str) -> None:
    limit = int(_setting("RATE_LIMIT_PER_MINUTE"))
    since = timezone.now() - timedelta(seconds=60)
    recent = SkillExecution.objects.filter(principal=principal, created_at__gte=since)
    count = recent.count()
    if count >= limit:
        oldest = recent.order_by("created_at").values_list("created_at", flat=True).first()
        age = 0.0 if oldest is None else (timezone.now() - oldest).total_seconds()
        wait = max(1, int(60 - age) + 1)
        raise SkillRateLimited(
            f"{principal} requested {count} skill executions in the last minute; the limit is "
            f"{limit}. Try again in {wait} s.",
            limit_per_minute=limit,
            retry_after_seconds=wait,
        )


def execution_request(
    *,
    skill: Skill,
    inputs: Any,
    caller: Caller,
    origin: str,
    idempotency_key: str | None = None,
    generic: bool = False,
) -> SkillExecution:
    """Validate, check access and the rate limit, pin the rendered program, enqueue.

    With an ``idempotency_key`` (agent tool calls) a second request with the same key returns
    the first execution instead of running the skill again (a re-issued call after a crash).
    """
    if idempotency_key:
        existing = SkillExecution.objects.filter(idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing
    skill_access_check(skill, caller, generic=generic)
    values = inputs_validate(skill, inputs)
    try:
        return _create(skill, values, caller, origin, idempotency_key)
    except IntegrityError:
        # A concurrent re-issue of the same call created it first.
        return SkillExecution.objects.get(idempotency_key=idempotency_key)


@transaction.atomic
def _create(
    skill: Skill,
    values: dict[str, Any],
    caller: Caller,
    origin: str,
    idempotency_key: str | None,
) -> SkillExecution:
    # Count and insert under one lock per principal (SQLite: the IMMEDIATE transaction's write
    # lock), so concurrent requests cannot all pass the last free slot.
    if sql.is_postgres():
        sql.fetch_all("SELECT pg_advisory_xact_lock(hashtext(%s))", [caller.principal])
    _rate_check(caller.principal)
    execution = SkillExecution.objects.create(
        skill=skill,
        tool_name=skill.tool_name,
        language=skill.language,
        code=render(skill.code_template, skill.language, values),
        inputs=values,
        timeout_seconds=skill.timeout_seconds,
        output_cap_bytes=skill.max_output_size_mb * MiB,
        network=skill_network(caller),
        allowed_hosts=list(skill_allowed_hosts(caller)),
        principal=caller.principal,
        origin=origin,
        run_id=caller.run_id,
        idempotency_key=idempotency_key,
        packages=list(skill.packages or []),
    )
    event_append(
        execution_id=execution.id,
        type=ExecutionEventType.QUEUED,
        data={"origin": origin, "principal": caller.principal, "code_bytes": len(execution.code)},
    )
    execution_nudge(execution.id)
    return execution


def execution_nudge(execution_id: uuid.UUID) -> None:
    """Send the wake-up call for one execution to the skills queue (``SKILLHUB["QUEUE"]``) once
    the transaction commits; a broker outage only delays it: the poller nudges again."""
    enqueue("skillhub.execute", str(execution_id), queue=_setting("QUEUE"))


# --- claim, run, finish ----------------------------------------------------------------------


def _as_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


@transaction.atomic
def execution_claim(*, execution_id: uuid.UUID, owner: str) -> ExecutionLease | None:
    """Claim a queued execution (lease = its timeout + margin); None when it is not claimable."""
    rows = sql.fetch_all(
        f"SELECT id, timeout_seconds FROM {_TABLE} WHERE id = %s AND status = %s"
        f"{sql.skip_locked()}",
        [sql.uuid_param(execution_id), ExecutionStatus.QUEUED.value],
    )
    if not rows:
        return None
    lease_seconds = float(rows[0][1]) + float(_setting("LEASE_MARGIN_SECONDS"))
    taken = sql.fetch_all(
        f"UPDATE {_TABLE} SET status = %s, lease_owner = %s, lease_token = lease_token + 1, "
        f"lease_expires_at = {sql.now_plus_sql()}, attempts = attempts + 1, "
        f"started_at = {sql.now_sql()} WHERE id = %s AND status = %s RETURNING lease_token",
        [
            ExecutionStatus.RUNNING.value,
            owner,
            sql.seconds_param(lease_seconds),
            sql.uuid_param(execution_id),
            ExecutionStatus.QUEUED.value,
        ],
    )
    if not taken:
        return None
    lease = ExecutionLease(execution_id, owner, int(taken[0][0]))
    attempt = sql.fetch_all(
        f"SELECT attempts, max_attempts FROM {_TABLE} WHERE id = %s", [sql.uuid_param(execution_id)]
    )[0]
    event_append(
        execution_id=execution_id,
        type=ExecutionEventType.CLAIMED,
        data={"worker": owner, "attempt": int(attempt[0]), "max_attempts": int(attempt[1])},
        lease_token=lease.token,
    )
    return lease


def _archive_files(archive: bytes) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        for info in zf.infolist():
            if not info.is_dir():
                files[info.filename] = zf.read(info)
    return files


def skill_files(skill: Skill) -> LocalCopy:
    """The files placed in the sandbox's working directory: a local-dir folder copied now
    (its roots rule checked again: LocalDirRefused), an s3 prefix fetched now (its bucket
    rule checked again: S3Refused), else the zip upload's files."""
    if skill.source == SkillSource.LOCAL_DIR:
        return local_dir_files(skill.source_ref)
    if skill.source == SkillSource.S3:
        return s3_files(skill.source_ref)
    if skill.archive:
        return LocalCopy(files=_archive_files(bytes(skill.archive)))
    return LocalCopy()


def sandbox_request_for(
    execution: SkillExecution, files: dict[str, bytes] | None = None
) -> SandboxRequest:
    """The sandbox request of an execution: its pinned program, inputs (also on stdin), the
    skill's files (``skill_files`` unless given) and limits; outputs come from ``out/``."""
    cap = int(execution.output_cap_bytes)
    return SandboxRequest(
        language=_LANGUAGES.get(execution.language, "python"),
        code=execution.code,
        stdin=json.dumps(execution.inputs),
        files=skill_files(execution.skill).files if files is None else files,
        env={"SKILL_TOOL_NAME": execution.tool_name, "SKILL_EXECUTION_ID": str(execution.id)},
        timeout_seconds=float(execution.timeout_seconds),
        limits=SandboxLimits(cpu_seconds=max(1, int(execution.timeout_seconds))),
        output_cap_bytes=cap,
        network=_NETWORKS.get(execution.network, "deny"),
        collect_outputs="*",
        output_file_cap_bytes=cap,
        output_total_cap_bytes=max(cap, 5 * cap),
    )


def execution_run(*, execution_id: uuid.UUID, owner: str) -> SkillExecution | None:
    """Claim, run and finish one execution (a skills worker's whole job); None if not claimed.

    Every stage is an event (``skillhub.services.events``); while the program runs a watcher
    thread appends ``progress`` (bytes of stdout/stderr so far, elapsed seconds) about once a
    second."""
    lease = execution_claim(execution_id=execution_id, owner=owner)
    if lease is None:
        return None
    execution = SkillExecution.objects.select_related("skill").get(pk=execution_id)
    try:
        copy = skill_files(execution.skill)
        request = sandbox_request_for(execution, files=copy.files)
        rendering = _rendering_data(request)
        if copy.skipped:
            rendering["skipped"] = storable(copy.skipped[:50])
        _event(lease, ExecutionEventType.RENDERING, rendering)
        try:
            request = _with_environment(lease, execution, request)
        except EnvBuildError as exc:
            execution_fail(lease=lease, error=str(exc))
            return _finished(execution_id)
        result = _run_watched(lease, request, execution.allowed_hosts or ())
    except SandboxError as exc:
        execution_fail(lease=lease, error=f"{type(exc).__name__}: {exc}")
    else:
        execution_store(lease=lease, result=result)
    return _finished(execution_id)


def _finished(execution_id: uuid.UUID) -> SkillExecution:
    """The execution as it ended, counted by its final status."""
    execution = SkillExecution.objects.get(pk=execution_id)
    SKILL_EXECUTIONS.labels(outcome=execution.status).inc()
    return execution


def _event(lease: ExecutionLease, type: ExecutionEventType, data: dict[str, Any]) -> bool:
    """A worker's own event: written only while it holds the lease."""
    return event_append(
        execution_id=lease.execution_id, type=type, data=data, lease_token=lease.token
    )


def _rendering_data(request: SandboxRequest) -> dict[str, Any]:
    return {
        "language": request.language,
        "code_bytes": len(request.code.encode()),
        "files": len(request.files),
        "files_bytes": sum(len(v) for v in request.files.values()),
        "network": request.network,
        "timeout_seconds": request.timeout_seconds,
    }


def _with_environment(
    lease: ExecutionLease, execution: SkillExecution, request: SandboxRequest
) -> SandboxRequest:
    """The request with the package environment of the execution's pinned packages (built or
    reused now, outside the sandbox; bound read-only inside it); unchanged without packages."""
    env = execution_environment(lease, execution)
    if env is None:
        return request
    data = {"packages": list(execution.packages), "pins": env.pins, "size_bytes": env.size_bytes,
            "built": env.built}  # fmt: skip
    _event(lease, ExecutionEventType.PACKAGES_CHECKED, data)
    return replace(request, packages_dir=str(env.path))


#: Seconds between two ``progress`` events of a running program.
PROGRESS_INTERVAL_SECONDS = 1.0
#: How often the watcher looks whether the sandbox has started.
_START_POLL_SECONDS = 0.05


class _Watcher:
    """Appends ``sandbox_started`` and then ``progress`` events from a thread of its own while
    ``run_sandboxed`` blocks the worker's thread. It stops writing once its lease is lost."""

    def __init__(self, lease: ExecutionLease, meter: OutputMeter) -> None:
        self.lease = lease
        self.meter = meter
        self.stop = threading.Event()
        self.started_sent = False
        self.lost = False
        self.thread = threading.Thread(
            target=self._loop, name=f"skill-progress-{lease.execution_id}", daemon=True
        )

    def _loop(self) -> None:
        try:
            next_progress = 0.0
            while not self.stop.wait(_START_POLL_SECONDS) and not self.lost:
                if self.meter.started_at is None:
                    continue
                if not self.started_sent:
                    self.announce_start()
                    next_progress = time.monotonic() + PROGRESS_INTERVAL_SECONDS
                elif time.monotonic() >= next_progress:
                    self.lost = not _event(self.lease, ExecutionEventType.PROGRESS, self.progress())
                    next_progress += PROGRESS_INTERVAL_SECONDS
        except Exception:  # progress is best effort: the result is still stored
            logger.warning("progress events of %s failed", self.lease.execution_id, exc_info=True)
        finally:
            connection.close()  # this thread's own connection

    def announce_start(self) -> None:
        self.started_sent = True
        data = {"backend": self.meter.backend}
        self.lost = not _event(self.lease, ExecutionEventType.SANDBOX_STARTED, data)

    def progress(self) -> dict[str, Any]:
        return {
            "stdout_bytes": self.meter.stdout_bytes,
            "stderr_bytes": self.meter.stderr_bytes,
            "elapsed_seconds": round(self.meter.elapsed(), 3),
        }

    def finish(self) -> None:
        """Stop the thread; a run too short for it to notice still gets ``sandbox_started``."""
        self.stop.set()
        self.thread.join()
        if self.meter.started_at is not None and not self.started_sent and not self.lost:
            self.announce_start()


#: A stored language as the sandbox's (the check constraint allows no other).
_LANGUAGES: dict[str, Language] = {"python": "python", "node": "node", "deno": "deno"}
#: A stored network mode as the sandbox's; anything else is denied.
_NETWORKS: dict[str, Network] = {"allow": "allow", "restricted": "restricted"}


def _run_watched(
    lease: ExecutionLease, request: SandboxRequest, allowed_hosts: Sequence[str]
) -> SandboxResult:
    meter = OutputMeter()
    watcher = _Watcher(lease, meter)
    watcher.thread.start()
    try:
        if request.network == "restricted":  # behind the allowlisting proxy
            return run_restricted(request, allowed_hosts, meter=meter)
        return run_sandboxed(request, meter=meter)
    finally:
        watcher.finish()


# --- recovery --------------------------------------------------------------------------------


@dataclass
class RecoverReport:
    requeued: list[uuid.UUID]
    failed: list[uuid.UUID]
    nudged: list[uuid.UUID]


@transaction.atomic
def _expired(limit: int) -> list[tuple[uuid.UUID, int, int]]:
    rows = sql.fetch_all(
        f"SELECT id, attempts, max_attempts FROM {_TABLE} WHERE status = %s "
        f"AND lease_expires_at < {sql.now_sql()} ORDER BY lease_expires_at LIMIT %s"
        f"{sql.skip_locked()}",
        [ExecutionStatus.RUNNING.value, limit],
    )
    out = []
    for rid, attempts, max_attempts in rows:
        execution_id = _as_uuid(rid)
        out.append((execution_id, int(attempts), int(max_attempts)))
        expired = SkillExecution.objects.filter(
            pk=execution_id, status=ExecutionStatus.RUNNING, lease_expires_at__lt=sql.time_now()
        )
        worker = expired.values_list("lease_owner", flat=True).first()
        counts = {"attempts": int(attempts), "max_attempts": int(max_attempts), "worker": worker}
        if int(attempts) >= int(max_attempts):
            error = f"the sandbox worker died or stalled {attempts} times; giving up"
            changed = expired.update(
                status=ExecutionStatus.FAILED,
                lease_owner=None,
                lease_expires_at=None,
                finished_at=timezone.now(),
                error=error,
            )
            kind, data = ExecutionEventType.FAILED, {**counts, "error": error, "by": "poller"}
        else:
            changed = expired.update(
                status=ExecutionStatus.QUEUED, lease_owner=None, lease_expires_at=None
            )
            kind, data = ExecutionEventType.REQUEUED, {**counts, "by": "poller"}
        if changed:
            event_append(execution_id=execution_id, type=kind, data=data)
    return out


def executions_recover(*, limit: int = 100) -> RecoverReport:
    """The poller: re-queue executions whose lease expired (their worker died), fail those out
    of attempts, and nudge queued executions nobody claimed for a while (a lost message)."""
    report = RecoverReport([], [], [])
    for execution_id, attempts, max_attempts in _expired(limit):
        if attempts >= max_attempts:
            report.failed.append(execution_id)
        else:
            report.requeued.append(execution_id)
            execution_nudge(execution_id)
    stale = timezone.now() - timedelta(seconds=float(_setting("RENUDGE_AFTER_SECONDS")))
    for execution_id in SkillExecution.objects.filter(
        status=ExecutionStatus.QUEUED, created_at__lt=stale
    ).values_list("id", flat=True)[:limit]:
        report.nudged.append(execution_id)
        execution_nudge(execution_id)
    return report


# --- waiting ---------------------------------------------------------------------------------


def execution_wait(*, execution_id: uuid.UUID, timeout: float) -> SkillExecution:
    """Poll the row until it is finished or ``timeout`` seconds passed; returns the row."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        execution = SkillExecution.objects.get(pk=execution_id)
        if execution.finished or time.monotonic() >= deadline:
            return execution
        time.sleep(min(delay, max(deadline - time.monotonic(), 0.01)))
        # Fine-grained at first (a trivial skill takes ~100 ms), then one read per 250 ms.
        delay = min(delay * 1.25, 0.25)


async def execution_wait_async(
    *, execution_id: uuid.UUID, timeout: float, cancelled: Any = None
) -> SkillExecution:
    """``execution_wait`` for the event loop: each read runs in a thread that closes its
    connection; ``cancelled`` (a threading.Event) stops the wait early."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        execution = await asyncio.to_thread(_read_closing, execution_id)
        if execution.finished or time.monotonic() >= deadline:
            return execution
        if cancelled is not None and cancelled.is_set():
            return execution
        await asyncio.sleep(min(delay, max(deadline - time.monotonic(), 0.01)))
        delay = min(delay * 1.25, 0.5)


def _read_closing(execution_id: uuid.UUID) -> SkillExecution:
    try:
        return SkillExecution.objects.get(pk=execution_id)
    finally:
        connection.close()  # a to_thread worker thread: keep no connection behind


def execution_manifest(execution: SkillExecution) -> list[dict[str, Any]]:
    """The output files as ``{name, size, downloadable}`` (no content)."""
    return [
        {"name": name, "size": size, "downloadable": has_data}
        for name, size, has_data in (
            (f.name, f.size, f.data is not None) for f in execution.output_files.all()
        )
    ]


def execution_summary(execution: SkillExecution) -> dict[str, Any]:
    """What a caller (agent, MCP client) gets back: status, exit, output, files."""
    return {
        "execution_id": str(execution.id),
        "tool_name": execution.tool_name,
        "status": execution.status,
        "exit_code": execution.exit_code,
        "timed_out": execution.timed_out,
        "killed_reason": execution.killed_reason or None,
        "duration_ms": execution.duration_ms,
        "stdout": execution.stdout,
        "stderr": execution.stderr,
        "stdout_truncated": execution.stdout_truncated,
        "error": execution.error or None,
        "output_files": execution_manifest(execution),
    }
