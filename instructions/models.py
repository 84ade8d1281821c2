"""Named prompt instructions and their versions.

The database holds the invariants, as for harness profiles: one row per (instruction, version),
at most one draft per instruction (a partial unique index), versions start at 1 and a published
version always has its publication time. Writes go through ``instructions.services``;
``InstructionVersion.save`` and ``delete`` also refuse to touch a published row, so a text a run
may have used never changes under it.
"""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from harness.models import VersionRow, VersionStatus
from runtime.prompt_template import INSTRUCTION_NAME

#: The longest instruction text (characters); the services refuse longer ones with a 400.
MAX_INSTRUCTION_CHARS = 100_000
#: What a name may be: the reference grammar's (``runtime.prompt_template.INSTRUCTION_NAME``).
NAME_RULE = "1-100 lower-case letters, digits, '-' or '_', starting with a letter or digit"
name_validator = RegexValidator(rf"^(?:{INSTRUCTION_NAME.pattern})\Z", f"A name is {NAME_RULE}.")


class Instruction(models.Model):
    """A named text prompts reference as ``${instructions.NAME}``; ``current_version`` is the
    published head (None until the first publish)."""

    name = models.CharField(max_length=100, unique=True, validators=[name_validator])
    description = models.TextField(blank=True, default="")
    current_version = models.ForeignKey(
        "InstructionVersion",
        null=True,
        blank=True,
        # The head can only go away together with its instruction (the versions cascade).
        on_delete=models.RESTRICT,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class InstructionVersion(VersionRow):
    """One version of an instruction's text; a published one never changes."""

    owner_noun = "instruction"

    instruction = models.ForeignKey(Instruction, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    text = models.TextField(blank=True, default="")
    status = models.CharField(
        max_length=10, choices=VersionStatus.choices, default=VersionStatus.DRAFT
    )
    note = models.CharField(max_length=500, blank=True, default="")
    created_by = models.CharField(max_length=150, blank=True, default="")
    published_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["instruction", "-version"]
        constraints = [
            models.UniqueConstraint(
                fields=["instruction", "version"], name="instruction_version_unique"
            ),
            models.UniqueConstraint(
                fields=["instruction"],
                condition=Q(status="draft"),
                name="instruction_one_draft",
            ),
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in VersionStatus]),
                name="instruction_version_status_valid",
            ),
            models.CheckConstraint(
                condition=Q(version__gte=1), name="instruction_version_positive"
            ),
            models.CheckConstraint(
                condition=(
                    Q(status="published", published_at__isnull=False)
                    | Q(status="draft", published_at__isnull=True)
                ),
                name="instruction_published_has_time",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.instruction_id}@{self.version} ({self.status})"
