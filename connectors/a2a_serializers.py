"""API shapes of external A2A agents. A header's value never appears: only the environment
variable that holds it, and whether that variable is allowed and set in this process."""

from __future__ import annotations

from rest_framework import serializers

from connectors.models import A2AAgent
from connectors.serializers import guard_url
from harness.planner import A2A_PREFIX
from orchestrator.strict import StrictModelSerializer
from runtime.secrets import api_key_configured


class A2AAgentSerializer(StrictModelSerializer[A2AAgent]):
    card_url = serializers.URLField(
        max_length=500,
        validators=[guard_url],
        help_text="The agent card's URL, or the agent's base URL (its card at "
        "/.well-known/agent-card.json); checked by the outbound guard when saved and on every "
        "connection.",
    )
    headers = serializers.DictField(
        child=serializers.CharField(max_length=100),
        required=False,
        help_text="Header name → the environment variable holding its value (a name the "
        "secret rule allows, e.g. LOOPWRIGHT_SECRET_AGENT_TOKEN); values are never stored.",
    )
    headers_configured = serializers.SerializerMethodField(
        help_text="Per header: whether its variable is allowed and set in this server process."
    )
    offered_as = serializers.SerializerMethodField(
        help_text="The tool name agents call (a2a__<name>); null until the card has been read."
    )
    card = serializers.JSONField(read_only=True, help_text="The agent card as last read.")

    class Meta:
        model = A2AAgent
        fields = [
            "name",
            "card_url",
            "headers",
            "headers_configured",
            "timeout_seconds",
            "effect",
            "enabled",
            "offered_as",
            "card",
            "card_read_at",
            "card_error",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["card_read_at", "card_error", "created_at", "updated_at"]

    def get_headers_configured(self, agent: A2AAgent) -> dict[str, bool]:
        return {h: api_key_configured(v) for h, v in (agent.headers or {}).items()}

    def get_offered_as(self, agent: A2AAgent) -> str | None:
        return f"{A2A_PREFIX}{agent.name}" if agent.card else None
