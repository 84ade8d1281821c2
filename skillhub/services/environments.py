"""A skill's package environment: built (or reused) before its runs, by initEnv, removed by
clearStorage; its record (``SkillEnvironment``) keeps the resolved versions (docs/skills.md).

The directory lives on the host that built it (``SKILLHUB["ENV_DIR"]``, a cache per host); the
row is shared, so every host and every rebuild after a clear installs the versions the first
build resolved (its ``lock``). A skill without packages has no environment.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from orchestrator.errors import InvalidInput
from sandbox import SandboxConfig
from skillhub.models import (
    EnvironmentStatus,
    ExecutionStatus,
    Skill,
    SkillEnvironment,
    SkillExecution,
)
from skillhub.services.envbuild import (
    BuiltEnv,
    EnvBuildError,
    EnvLimits,
    EnvPlan,
    env_ensure,
    env_path,
    env_remove,
    interpreter_version,
)
from skillhub.services.results import ExecutionLease


def _setting(name: str) -> Any:
    return settings.SKILLHUB[name]


def env_root() -> Path:
    return Path(_setting("ENV_DIR"))


def env_limits() -> EnvLimits:
    return EnvLimits(
        size_cap_bytes=int(_setting("ENV_MAX_MB")) * 1024 * 1024,
        timeout_seconds=float(_setting("ENV_BUILD_TIMEOUT_SECONDS")),
    )


def env_plan(language: str, packages: list[str]) -> EnvPlan | None:
    """What the environment of these packages is (None: no packages, no environment)."""
    if not packages or language not in ("python", "node"):
        return None
    interpreter = SandboxConfig.from_env().interpreter(language)
    index = _setting("NPM_REGISTRY") if language == "node" else _setting("PIP_INDEX_URL")
    return EnvPlan(
        language=language,
        interpreter=interpreter,
        interpreter_version=interpreter_version(interpreter, language),
        specs=tuple(sorted(str(p) for p in packages)),
        index_url=str(index),
    )


def environment_ensure(*, language: str, packages: list[str]) -> BuiltEnv | None:
    """Build or reuse the environment (installing the recorded lock when there is one) and
    record the outcome; None without packages. Raises EnvBuildError naming the packages."""
    plan = env_plan(language, packages)
    if plan is None:
        return None
    row = SkillEnvironment.objects.filter(key=plan.key).first()
    try:
        built = env_ensure(
            root=env_root(), plan=plan, lock=row.lock if row else "", limits=env_limits()
        )
    except EnvBuildError as exc:
        _record(plan, status=EnvironmentStatus.FAILED, error=str(exc))
        raise
    if built.built or row is None or row.status != EnvironmentStatus.READY:
        _record(plan, status=EnvironmentStatus.READY, built=built)
    return built


def _record(
    plan: EnvPlan, *, status: EnvironmentStatus, built: BuiltEnv | None = None, error: str = ""
) -> None:
    values: dict[str, Any] = {
        "language": plan.language, "interpreter": plan.interpreter_version,
        "index_url": plan.index_url, "specs": list(plan.specs), "status": status,
        "error": error[:4000],
    }  # fmt: skip
    if built is not None:
        values.update(pins=built.pins, lock=built.lock, size_bytes=built.size_bytes)
        if built.built:
            values["built_at"] = timezone.now()
    with transaction.atomic():
        SkillEnvironment.objects.update_or_create(key=plan.key, defaults=values)


def environment_init(*, skill: Skill) -> dict[str, Any]:
    """initEnv: build (or reuse) the skill's environment now; a package that cannot be had is
    an InvalidInput pointing at its ``/packages/N``."""
    packages = [str(p) for p in (skill.packages or [])]
    try:
        environment_ensure(language=skill.language, packages=packages)
    except EnvBuildError as exc:
        at = [i for i, spec in enumerate(packages) if spec in exc.packages]
        errors = [{"pointer": f"/packages/{i}", "detail": str(exc), "code": "unavailable"}
                  for i in at] or [{"pointer": "/packages", "detail": str(exc),
                                    "code": "unavailable"}]  # fmt: skip
        raise InvalidInput(str(exc), errors=errors) from exc
    return environment_status(skill=skill)


def environment_clear(*, skill: Skill) -> dict[str, Any]:
    """clearStorage: delete the skill's environment on this host; its versions stay recorded,
    so the next build installs them again."""
    plan = _plan_or_none(skill)
    removed = False
    if plan is not None:
        removed = env_remove(root=env_root(), key=plan.key)
        SkillEnvironment.objects.filter(key=plan.key).update(
            status=EnvironmentStatus.CLEARED, updated_at=timezone.now()
        )
    return {**environment_status(skill=skill), "removed": removed}


def _plan_or_none(skill: Skill) -> EnvPlan | None:
    try:
        return env_plan(skill.language, [str(p) for p in (skill.packages or [])])
    except EnvBuildError:  # the interpreter cannot run: nothing is built for it either
        return None


def _unplanned(packages: list[str], status: str, error: str = "") -> dict[str, Any]:
    return {"status": status, "packages": packages, "key": None, "pins": [], "size_bytes": 0,
            "built_at": None, "error": error, "index_url": None, "interpreter": None,
            "on_disk": False}  # fmt: skip


def environment_status(*, skill: Skill) -> dict[str, Any]:
    """What the API and the skill page show: the row, and whether it is built on this host."""
    packages = [str(p) for p in (skill.packages or [])]
    try:
        plan = env_plan(skill.language, packages)
    except EnvBuildError as exc:
        return _unplanned(packages, "failed", str(exc))
    if plan is None:
        return _unplanned([], "none")
    row = SkillEnvironment.objects.filter(key=plan.key).first()
    return {
        "status": row.status if row else "missing",
        "packages": packages,
        "key": plan.key,
        "pins": list(row.pins) if row else [],
        "size_bytes": row.size_bytes if row else 0,
        "built_at": row.built_at if row else None,
        "error": row.error if row else "",
        "index_url": plan.index_url,
        "interpreter": plan.interpreter_version,
        "on_disk": env_path(env_root(), plan.key) is not None,
    }


def execution_environment(lease: ExecutionLease, execution: SkillExecution) -> BuiltEnv | None:
    """The environment of an execution's pinned packages, built by the skills worker before
    the run. The lease is first extended by the build timeout, so a slow build does not look
    like a dead worker to the poller. Raises EnvBuildError."""
    packages = [str(p) for p in (execution.packages or [])]
    if not packages:
        return None
    seconds = (
        float(_setting("ENV_BUILD_TIMEOUT_SECONDS"))
        + float(execution.timeout_seconds)
        + float(_setting("LEASE_MARGIN_SECONDS"))
    )
    SkillExecution.objects.filter(
        pk=lease.execution_id, status=ExecutionStatus.RUNNING, lease_token=lease.token
    ).update(lease_expires_at=timezone.now() + timedelta(seconds=seconds))
    return environment_ensure(language=execution.language, packages=packages)
