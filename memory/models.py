"""Agent memory rows (docs/memory.md): what an AI employee or a person saved, and every use of it.

A :class:`MemoryItem` lives in one scope, and its keys say whose it is: ``public`` (everyone;
no person, no employee), ``user`` (one person: ``username``) or ``agent_user`` (one employee's
memory of one person: ``employee`` and ``username``). The database holds that rule as check
constraints. A :class:`MemoryUse` records each time a run or a chat was given an item (injected
into its prompt), found it (``memory_search``), saved it, or a person edited it; a deleted item
goes with its uses.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MaxLengthValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

#: Most characters of one item's content.
MAX_CONTENT_CHARS = 4000
MAX_TAGS = 20
MAX_TAG_CHARS = 50
#: Usernames of people and employees (Django's user name length).
MAX_NAME = 150


class MemoryItemScope(models.TextChoices):
    PUBLIC = "public", "public (everyone)"
    USER = "user", "user (one person)"
    AGENT_USER = "agent_user", "agent_user (one employee's memory of one person)"


class MemoryUseKind(models.TextChoices):
    INJECTED = "injected", "injected into a prompt"
    SEARCHED = "searched", "found by memory_search"
    SAVED = "saved", "saved"
    DELETED = "deleted", "deleted"
    EDITED = "edited", "edited"


def validate_tags(value: Any) -> None:
    """Tags are a list of at most ``MAX_TAGS`` distinct non-empty short strings."""
    if not isinstance(value, list):
        raise ValidationError("tags must be a list of strings.")
    if len(value) > MAX_TAGS:
        raise ValidationError(f"At most {MAX_TAGS} tags.")
    for tag in value:
        if not isinstance(tag, str) or not tag.strip():
            raise ValidationError("Each tag must be a non-empty string.")
        if len(tag) > MAX_TAG_CHARS:
            raise ValidationError(f"A tag has at most {MAX_TAG_CHARS} characters.")
    if len(set(value)) != len(value):
        raise ValidationError("Tags must be distinct.")


#: The keys each scope needs: public has none, user a person, agent_user both.
SCOPE_KEYS = (
    Q(scope=MemoryItemScope.PUBLIC, username="", employee="")
    | (Q(scope=MemoryItemScope.USER, employee="") & ~Q(username=""))
    | (Q(scope=MemoryItemScope.AGENT_USER) & ~Q(username="") & ~Q(employee=""))
)


class MemoryItem(models.Model):
    """One remembered fact, in one scope."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    scope = models.CharField(max_length=12, choices=MemoryItemScope.choices)
    #: The person it is about ("" for public).
    username = models.CharField(max_length=MAX_NAME, blank=True, default="")
    #: The AI employee whose memory it is (agent_user only, "" otherwise).
    employee = models.CharField(max_length=MAX_NAME, blank=True, default="")
    content = models.TextField(validators=[MaxLengthValidator(MAX_CONTENT_CHARS)])
    tags = models.JSONField(default=list, blank=True, validators=[validate_tags])
    #: A person's username, or ``agent:<employee>`` for an item a tool saved.
    created_by = models.CharField(max_length=MAX_NAME + 6)
    #: The run that saved it (a tool call in a run), else None.
    source_run = models.UUIDField(null=True, blank=True)
    #: The ``memory_save`` call that saved it (``ToolContext.call_key``): a re-issued call
    #: finds its item instead of saving it twice. None for items people create.
    call_key = models.CharField(max_length=200, null=True, blank=True, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "memory item"
        constraints = [
            models.CheckConstraint(
                condition=Q(scope__in=MemoryItemScope.values), name="memory_item_scope_known"
            ),
            models.CheckConstraint(condition=SCOPE_KEYS, name="memory_item_scope_keys"),
        ]
        indexes = [
            # What a prompt and a search read: a scope's items of one person (and employee),
            # newest first.
            models.Index(
                fields=["scope", "username", "employee", "-created_at"], name="memory_item_scope"
            ),
            models.Index(fields=["-created_at"], name="memory_item_created"),
        ]

    def __str__(self) -> str:
        return f"[{self.scope}] {self.content[:40]}"

    def clean(self) -> None:
        problems: dict[str, str] = {}
        if self.scope == MemoryItemScope.PUBLIC:
            if self.username:
                problems["username"] = "A public item belongs to nobody: leave username empty."
            if self.employee:
                problems["employee"] = "Only an agent_user item names an employee."
        elif self.scope in (MemoryItemScope.USER, MemoryItemScope.AGENT_USER):
            if not self.username:
                problems["username"] = f"A {self.scope} item needs the person's username."
            if self.scope == MemoryItemScope.USER and self.employee:
                problems["employee"] = "Only an agent_user item names an employee."
            if self.scope == MemoryItemScope.AGENT_USER and not self.employee:
                problems["employee"] = "An agent_user item needs the employee's username."
        if self.content is not None and not self.content.strip():
            problems["content"] = "The content is empty."
        if problems:
            raise ValidationError(problems)


class MemoryUse(models.Model):
    """One use of an item by a run or a chat (or an edit by a person)."""

    item = models.ForeignKey(MemoryItem, on_delete=models.CASCADE, related_name="uses")
    kind = models.CharField(max_length=10, choices=MemoryUseKind.choices)
    #: The run that used it; None for a chat (and for a person's edit).
    run_id = models.UUIDField(null=True, blank=True)
    #: The invocation within the run (``maker:0``), ``chat`` for a chat; "" for a person.
    invocation = models.CharField(max_length=100, blank=True, default="")
    chat = models.BooleanField(default=False)
    #: ``agent:<employee>``, or the person's username.
    actor = models.CharField(max_length=MAX_NAME + 6)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name = "memory use"
        constraints = [
            models.CheckConstraint(
                condition=Q(kind__in=MemoryUseKind.values), name="memory_use_kind_known"
            ),
        ]
        indexes = [
            models.Index(fields=["item", "-at"], name="memory_use_item"),
            models.Index(fields=["run_id"], name="memory_use_run"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.item_id} by {self.actor}"
