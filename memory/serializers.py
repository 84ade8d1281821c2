"""API shapes of agent memory: an item (created by a person; only content and tags change
afterwards) and a use of it."""

from __future__ import annotations

from rest_framework import serializers

from memory.models import MAX_CONTENT_CHARS, MAX_TAG_CHARS, MAX_TAGS, MemoryItem, MemoryUse
from orchestrator.strict import StrictModelSerializer

_TAGS_HELP = f"At most {MAX_TAGS} distinct labels of at most {MAX_TAG_CHARS} characters."


def _tags_field() -> serializers.ListField:
    return serializers.ListField(
        child=serializers.CharField(max_length=MAX_TAG_CHARS),
        max_length=MAX_TAGS,
        required=False,
        help_text=_TAGS_HELP,
    )


class MemoryItemSerializer(StrictModelSerializer[MemoryItem]):
    content = serializers.CharField(
        max_length=MAX_CONTENT_CHARS,
        trim_whitespace=False,
        help_text=f"The remembered text, at most {MAX_CONTENT_CHARS} characters.",
    )
    tags = _tags_field()

    class Meta:
        model = MemoryItem
        fields = [
            "id",
            "scope",
            "username",
            "employee",
            "content",
            "tags",
            "created_by",
            "source_run",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "created_by", "source_run", "created_at", "updated_at"]
        extra_kwargs = {
            "scope": {
                "help_text": "public: everyone's; user: one person's (username); agent_user: "
                "one employee's memory of one person (employee and username)."
            },
            "username": {"help_text": "The person it is about; empty for public."},
            "employee": {"help_text": "The AI employee whose memory it is; agent_user only."},
        }


class MemoryItemEditSerializer(StrictModelSerializer[MemoryItem]):
    """A partial update: only the content and the tags change (scope and owners never do)."""

    content = serializers.CharField(
        max_length=MAX_CONTENT_CHARS, trim_whitespace=False, required=False
    )
    tags = _tags_field()

    class Meta:
        model = MemoryItem
        fields = ["content", "tags"]


class MemoryUseSerializer(serializers.ModelSerializer[MemoryUse]):
    class Meta:
        model = MemoryUse
        fields = ["id", "kind", "run_id", "invocation", "chat", "actor", "at"]
        read_only_fields = fields
        extra_kwargs = {
            "run_id": {"help_text": "The run that used the item; null for a chat or a person."},
            "invocation": {"help_text": "The invocation within the run (maker:0), or chat."},
            "actor": {"help_text": "agent:<employee>, or the person's username."},
        }
