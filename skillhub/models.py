"""Skill definitions, their executions and output files, and review configs (docs/skills.md).

A skill is a small Python or Node.js program with a ``codeTemplate``; an execution pins the
rendered program, the inputs and the limits at the moment it was requested, so a later edit of
the skill never changes what an already queued execution runs. Executions are claimed by
sandbox workers with a lease and a fencing token, like runs (``skillhub.services.executions``).
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

#: ``skill_hub_`` + tool name must stay within the 64 characters tool names may have.
TOOL_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,47}$"
TOOL_PREFIX = "skill_hub_"


class SkillLanguage(models.TextChoices):
    PYTHON = "python", "Python"
    NODE = "node", "Node.js"
    DENO = "deno", "Deno (TypeScript)"


class ToolScope(models.TextChoices):
    #: Only employees that bind the skill's own tool (``skill_hub_<toolName>``) in their tools.
    CUSTOM = "custom", "Custom (bound per employee)"
    #: Every AI employee.
    GENERAL = "general", "General (all employees)"
    #: Only the employees the skill names.
    SPECIFIED = "specified", "Specified employees"


class SkillSource(models.TextChoices):
    DB_ZIP = "db-zip", "Database (zip upload)"
    LOCAL_DIR = "local-dir", "Local directory"
    GIT = "git", "Git repository"
    #: A package of a registry index (``skillhub.services.registry``).
    REGISTRY = "registry", "Registry package"
    #: Objects under a prefix of an S3-compatible bucket (``skillhub.services.s3source``).
    S3 = "s3", "S3 bucket prefix"


class Skill(models.Model):
    """A skill definition; ``tool_name`` is immutable once created."""

    tool_name = models.CharField(max_length=48, unique=True)
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    instructions = models.TextField(blank=True, default="")
    code_template = models.TextField()
    language = models.CharField(max_length=10, choices=SkillLanguage.choices)
    input_schema = models.JSONField(default=dict)
    interaction_schema = models.JSONField(null=True, blank=True)
    packages = models.JSONField(default=list, blank=True)
    timeout_seconds = models.PositiveIntegerField(default=30)
    max_output_size_mb = models.PositiveIntegerField(default=1)
    enabled = models.BooleanField(default=True)
    #: True: the skill may run without a human gate (its tool is declared read-effect to the
    #: harness); False: the harness treats it as a write and asks unless trusted.
    auto_call = models.BooleanField(default=False)
    tool_scope = models.CharField(max_length=10, choices=ToolScope.choices, default="general")
    #: Employee usernames, for ``specified``.
    employees = models.JSONField(default=list, blank=True)
    source = models.CharField(max_length=10, choices=SkillSource.choices, default="db-zip")
    #: local-dir: the directory; git: the repository path or URL; s3: s3://bucket/prefix/.
    source_ref = models.CharField(max_length=1000, blank=True, default="")
    #: git: the skill's folder inside the repository.
    source_path = models.CharField(max_length=500, blank=True, default="")
    #: git: the commit the skill was last synced from.
    source_commit = models.CharField(max_length=64, blank=True, default="")
    #: db-zip: a zip whose files are placed in the sandbox working directory.
    archive = models.BinaryField(null=True, blank=True)
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tool_name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(timeout_seconds__gte=1) & Q(timeout_seconds__lte=600),
                name="skillhub_skill_timeout_range",
            ),
            models.CheckConstraint(
                condition=Q(max_output_size_mb__gte=1) & Q(max_output_size_mb__lte=100),
                name="skillhub_skill_output_range",
            ),
            models.CheckConstraint(
                condition=Q(language__in=["python", "node", "deno"]),
                name="skillhub_skill_language",
            ),
        ]

    def __str__(self) -> str:
        return self.tool_name

    @property
    def agent_tool_name(self) -> str:
        return TOOL_PREFIX + self.tool_name


class SkillVersion(models.Model):
    """One state of a skill after a change (create, edit, sync, install, rollback): every
    editable field, written in the change's transaction and never altered
    (``skillhub.services.versions``)."""

    skill = models.ForeignKey(Skill, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    #: Every editable field but the archive, plus ``source_commit``.
    state = models.JSONField()
    archive = models.BinaryField(null=True, blank=True)
    archive_sha256 = models.CharField(max_length=64, blank=True, default="")
    actor = models.CharField(max_length=150, blank=True, default="")
    #: What made it: ``create``, ``update``, ``git-sync``, ``registry``, ``rollback``, ``baseline``.
    kind = models.CharField(max_length=20)
    reason = models.TextField(blank=True, default="")
    #: rollback: the version whose state was restored.
    restored_from = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["skill", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["skill", "number"], name="skillhub_version_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.skill_id} v{self.number}"

    def save(self, *args: object, **kwargs: object) -> None:
        if not self._state.adding:
            raise ValueError("skill versions are immutable")
        super().save(*args, **kwargs)  # type: ignore[arg-type]


class ExecutionStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


FINISHED_STATUSES = (ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED)


class SkillExecution(models.Model):
    """One requested run of a skill: pinned program and limits, lease, and the result."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    skill = models.ForeignKey(Skill, on_delete=models.PROTECT, related_name="executions")
    tool_name = models.CharField(max_length=48)
    language = models.CharField(max_length=10, choices=SkillLanguage.choices)
    #: The rendered program (placeholders replaced by literals) that the sandbox runs.
    code = models.TextField()
    inputs = models.JSONField(default=dict)
    timeout_seconds = models.PositiveIntegerField()
    output_cap_bytes = models.PositiveBigIntegerField()
    network = models.CharField(max_length=10, default="deny")
    #: The hosts a ``restricted`` network may reach (the caller's ``isolation.allowedHosts``).
    allowed_hosts = models.JSONField(default=list, blank=True)
    #: The skill's declared packages, installed into its package environment before the run.
    packages = models.JSONField(default=list, blank=True)
    status = models.CharField(
        max_length=10, choices=ExecutionStatus.choices, default=ExecutionStatus.QUEUED
    )
    #: ``user:<username>`` or ``employee:<username>``: who the rate limit counts.
    principal = models.CharField(max_length=200)
    #: ``api``, ``test``, ``mcp`` or ``agent``.
    origin = models.CharField(max_length=10, default="api")
    run_id = models.UUIDField(null=True, blank=True)
    #: The agent tool call's key: a re-issued call finds its execution instead of running twice.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True, unique=True)
    lease_owner = models.CharField(max_length=200, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    lease_token = models.BigIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=3)
    stdout = models.TextField(blank=True, default="")
    stderr = models.TextField(blank=True, default="")
    exit_code = models.IntegerField(null=True, blank=True)
    timed_out = models.BooleanField(default=False)
    killed_reason = models.CharField(max_length=20, blank=True, default="")
    stdout_truncated = models.BooleanField(default=False)
    stderr_truncated = models.BooleanField(default=False)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    backend = models.CharField(max_length=20, blank=True, default="")
    notes = models.JSONField(default=list, blank=True)
    #: Why the execution failed without a program result (sandbox unavailable, dead workers).
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["principal", "created_at"], name="skillhub_exec_principal"),
            models.Index(fields=["status", "lease_expires_at"], name="skillhub_exec_lease"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in ExecutionStatus]),
                name="skillhub_exec_status",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} {self.id}"

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES


class ExecutionEventType(models.TextChoices):
    QUEUED = "queued", "Queued"
    CLAIMED = "claimed", "Claimed by a worker"
    RENDERING = "rendering", "Preparing the sandbox request"
    PACKAGES_CHECKED = "packages_checked", "Package environment ready"
    SANDBOX_STARTED = "sandbox_started", "Sandbox started"
    PROGRESS = "progress", "Output so far"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    TIMED_OUT = "timed_out", "Timed out"
    REQUEUED = "requeued", "Recovered by the poller"


TERMINAL_EVENT_TYPES = (
    ExecutionEventType.SUCCEEDED,
    ExecutionEventType.FAILED,
    ExecutionEventType.TIMED_OUT,
)


class SkillExecutionEvent(models.Model):
    """One step of an execution, append-only; ``seq`` (1, 2, ...) is assigned under the
    execution's row lock, so seq order is commit order (``skillhub.services.events``)."""

    execution = models.ForeignKey(SkillExecution, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=20, choices=ExecutionEventType.choices)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["execution", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["execution", "seq"], name="skillhub_event_seq_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.execution_id} #{self.seq} {self.type}"


class SkillOutputFile(models.Model):
    """A file the program left under ``out/``; ``data`` is None when it was over a cap."""

    execution = models.ForeignKey(
        SkillExecution, on_delete=models.CASCADE, related_name="output_files"
    )
    name = models.CharField(max_length=500)
    size = models.PositiveBigIntegerField()
    data = models.BinaryField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["execution", "name"], name="skillhub_output_unique"),
        ]

    def __str__(self) -> str:
        return self.name


class SkillLoopConfig(models.Model):
    """skillLoopConfigs: a human review template for a skill's calls."""

    skill = models.OneToOneField(Skill, on_delete=models.CASCADE, related_name="loop_config")
    requires_review = models.BooleanField(default=True)
    review_prompt = models.TextField(blank=True, default="")
    review_schema = models.JSONField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"review of {self.skill_id}"


#: A skill directory's key and a skill's name in it.
DIRECTORY_KEY = r"^[a-z0-9]+([-_][a-z0-9]+)*$"
DIRECTORY_SKILL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class DirectorySource(models.TextChoices):
    #: A folder under ``LOOPWRIGHT_SKILLS_ROOT``.
    FOLDER = "folder", "Folder under the skills root"
    #: A folder of a Git repository, checked out through the outbound guard.
    GIT = "git", "Git repository"


class SkillDirectory(models.Model):
    """A skills directory (``*/SKILL.md``): instructions the model loads with the ``skill`` tool
    (docs/skill-directories.md). Deny by default: only the listed ``employees`` see it."""

    key = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True, default="")
    source = models.CharField(max_length=10, choices=DirectorySource.choices)
    #: folder: the folder under the skills root; git: the folder of the repository ("" = root).
    path = models.CharField(max_length=1000, blank=True, default="")
    repository = models.CharField(max_length=2000, blank=True, default="")
    ref = models.CharField(max_length=200, blank=True, default="HEAD")
    #: Usernames of the employees that may use the directory (empty: nobody).
    employees = models.JSONField(default=list, blank=True)
    #: Allowlist of skill names (empty: every skill of the directory).
    skills = models.JSONField(default=list, blank=True)
    #: git: the commit the last sync read.
    commit = models.CharField(max_length=64, blank=True, default="")
    synced_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["key"]
        constraints = [
            models.CheckConstraint(
                condition=Q(source__in=["folder", "git"]), name="skillhub_skilldir_source"
            ),
        ]

    def __str__(self) -> str:
        return self.key


class DirectorySkill(models.Model):
    """One ``SKILL.md`` of a directory, as its last sync read it (replaced by each sync)."""

    directory = models.ForeignKey(SkillDirectory, on_delete=models.CASCADE, related_name="entries")
    name = models.CharField(max_length=64)
    description = models.TextField()
    instructions = models.TextField(blank=True, default="")
    #: The SKILL.md's path within the directory (``pdf/SKILL.md``).
    source_path = models.CharField(max_length=1000)
    sha256 = models.CharField(max_length=64)

    class Meta:
        ordering = ["directory", "name"]
        constraints = [
            models.UniqueConstraint(fields=["directory", "name"], name="skillhub_dirskill_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.directory_id}:{self.name}"


class EnvironmentStatus(models.TextChoices):
    READY = "ready", "Ready"
    FAILED = "failed", "Build failed"
    #: Deleted by clearStorage; ``lock`` is kept so the rebuild installs the same versions.
    CLEARED = "cleared", "Cleared"


class SkillEnvironment(models.Model):
    """A package environment on disk (``skillhub.services.envbuild``), one row per key: skills
    declaring the same packages for the same interpreter and index share it. ``lock`` is what
    the first build resolved; every rebuild of the key installs exactly it."""

    key = models.CharField(max_length=64, unique=True)
    language = models.CharField(max_length=10, choices=SkillLanguage.choices)
    #: ``python 3.11.2`` / ``node v20.1.0``.
    interpreter = models.CharField(max_length=100)
    index_url = models.CharField(max_length=2000)
    specs = models.JSONField(default=list)
    status = models.CharField(max_length=10, choices=EnvironmentStatus.choices)
    #: Every installed distribution as ``name==version`` / ``name@version``.
    pins = models.JSONField(default=list, blank=True)
    #: Python: requirement lines; npm: ``package-lock.json``. Empty until a build succeeded.
    lock = models.TextField(blank=True, default="")
    size_bytes = models.PositiveBigIntegerField(default=0)
    built_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in EnvironmentStatus]),
                name="skillhub_env_status",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.language} env {self.key}"
