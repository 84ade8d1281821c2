"""Writing a claimed execution's outcome, fenced by its lease token; a write that cannot fail
on content, and a program that is never run again because its result could not be stored.

PostgreSQL text and JSON cannot hold U+0000 (nor unpaired surrogates, which a path decoded with
``surrogateescape`` may carry). Every string written here (stdout, stderr, error, notes, event
data) has those characters replaced by U+FFFD, the character already used for bytes that are
not UTF-8, and a note says how many were replaced. If the write still fails, the execution
fails at once with that reason (``cause: result_not_stored`` in its ``failed`` event) instead of
being left to the poller, which would run the program again. A lost database connection is
retried for ``STORE_RETRY_SECONDS`` first.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from sandbox import SandboxResult
from skillhub.models import ExecutionEventType, ExecutionStatus, SkillExecution, SkillOutputFile
from skillhub.services.events import event_append

logger = logging.getLogger(__name__)
#: How long a result write is retried while the database connection is lost.
STORE_RETRY_SECONDS = 20.0
#: What replaces characters PostgreSQL cannot store (U+0000, unpaired surrogates).
REPLACEMENT = "\ufffd"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
#: ``cause`` of the failed event of an execution whose result could not be stored.
CAUSE_NOT_STORED = "result_not_stored"


@dataclass(frozen=True)
class ExecutionLease:
    execution_id: uuid.UUID
    owner: str
    token: int


def storable_text(text: str) -> tuple[str, int]:
    """``text`` with U+0000 and unpaired surrogates replaced by U+FFFD, and how many were."""
    return _UNSTORABLE.subn(REPLACEMENT, text)


def storable(value: Any) -> Any:
    """A JSON value with every string (keys too) made storable."""
    if isinstance(value, str):
        return storable_text(value)[0]
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable(v) for v in value]
    return value


def _fenced_update(lease: ExecutionLease, **fields: Any) -> int:
    return SkillExecution.objects.filter(
        pk=lease.execution_id,
        status=ExecutionStatus.RUNNING,
        lease_token=lease.token,
    ).update(lease_owner=None, lease_expires_at=None, finished_at=timezone.now(), **fields)


def _texts(result: SandboxResult) -> tuple[str, str, list[str]]:
    stdout, out_replaced = storable_text(result.stdout)
    stderr, err_replaced = storable_text(result.stderr)
    notes = [storable_text(n)[0] for n in result.notes]
    for name, count in (("stdout", out_replaced), ("stderr", err_replaced)):
        if count:
            notes.append(
                f"{name}: {count} NUL or unpaired surrogate characters stored as U+FFFD "
                "(the database cannot hold them)"
            )
    return stdout, stderr, notes


@transaction.atomic
def execution_finish(*, lease: ExecutionLease, result: SandboxResult) -> bool:
    """Store a program's result (fenced by the lease token); False when the lease was lost."""
    ok = result.exit_code == 0 and result.killed_reason is None and not result.timed_out
    stdout, stderr, notes = _texts(result)
    written = _fenced_update(
        lease,
        status=ExecutionStatus.SUCCEEDED if ok else ExecutionStatus.FAILED,
        stdout=stdout,
        stderr=stderr,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        killed_reason=result.killed_reason or "",
        stdout_truncated=result.stdout_truncated,
        stderr_truncated=result.stderr_truncated,
        duration_ms=result.duration_ms,
        backend=result.backend,
        notes=notes,
        error="" if ok else failure_text(result),
    )
    if not written:
        return False
    if ok:
        kind = ExecutionEventType.SUCCEEDED
    elif result.timed_out or result.killed_reason == "timeout":
        kind = ExecutionEventType.TIMED_OUT
    else:
        kind = ExecutionEventType.FAILED
    data: dict[str, Any] = {
        "exit_code": result.exit_code,
        "duration_ms": result.duration_ms,
        "killed_reason": result.killed_reason,
        "stdout_bytes": len(stdout.encode()),
        "stderr_bytes": len(stderr.encode()),
        "output_files": len(result.output_files),
    }
    if not ok:
        data["error"] = failure_text(result)
    event_append(execution_id=lease.execution_id, type=kind, data=data)
    SkillOutputFile.objects.bulk_create(
        SkillOutputFile(
            execution_id=lease.execution_id,
            name=storable_text(f.name)[0],
            size=f.size,
            data=f.data,
        )
        for f in result.output_files
    )
    return True


def failure_text(result: SandboxResult) -> str:
    """Why a program's run failed, in words; a cap names the stream that passed it."""
    if result.timed_out or result.killed_reason == "timeout":
        return "killed: the skill ran past its timeout"
    if result.killed_reason == "output_cap":
        cut = {"stdout": result.stdout_truncated, "stderr": result.stderr_truncated}
        which = " and ".join(name for name, was_cut in cut.items() if was_cut) or "the output"
        return f"killed: {which} passed the output cap (max_output_size_mb); the rest was dropped"
    if result.killed_reason:
        return f"killed: {result.killed_reason} limit"
    return f"the program exited with status {result.exit_code}"


@transaction.atomic
def execution_fail(*, lease: ExecutionLease, error: str, cause: str | None = None) -> bool:
    """Fail a claimed execution without a program result (e.g. the sandbox cannot run)."""
    text = storable_text(error)[0]
    if not _fenced_update(lease, status=ExecutionStatus.FAILED, error=text):
        return False
    data = {"error": text} if cause is None else {"error": text, "cause": cause}
    event_append(execution_id=lease.execution_id, type=ExecutionEventType.FAILED, data=data)
    return True


def execution_store(*, lease: ExecutionLease, result: SandboxResult) -> bool:
    """Store a program's result; False when the lease was lost. The program has run, so it is
    never left for the poller: a write that fails (other than a lost connection, retried for
    ``STORE_RETRY_SECONDS``) fails the execution once, with the reason."""
    deadline = time.monotonic() + STORE_RETRY_SECONDS
    while True:
        try:
            return execution_finish(lease=lease, result=result)
        except (OperationalError, InterfaceError):
            if time.monotonic() >= deadline:
                raise
            logger.warning("storing execution %s: database unavailable, retrying",
                           lease.execution_id, exc_info=True)  # fmt: skip
            connection.close()
            time.sleep(1.0)
        except Exception as exc:
            logger.exception("the result of execution %s could not be stored", lease.execution_id)
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return execution_fail(
                lease=lease,
                error=(
                    f"the program ran (exit {result.exit_code}) but its result could not be "
                    f"stored ({type(exc).__name__}: {reason[:300]}); it is not run again"
                ),
                cause=CAUSE_NOT_STORED,
            )
