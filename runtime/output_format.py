"""What a role's final answer must be: free text, or a JSON object (with a schema)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.invocation import InvocationRequest
from runtime.types import ResponseFormat
from runtime.validation import Invalid, parse_json_lenient, validator_for


@dataclass(frozen=True)
class OutputFormat:
    """What the role's final answer must be: free text, or a JSON object (with a schema)."""

    response_format: ResponseFormat = "text"
    schema: dict[str, Any] | None = None

    @property
    def structured(self) -> bool:
        return self.response_format != "text"

    @classmethod
    def of(cls, request: InvocationRequest) -> OutputFormat:
        wanted = request.context.get("response_format")
        schema = request.context.get("response_schema")
        schema = schema if isinstance(schema, dict) else None
        if wanted == "json_schema" and schema is not None:
            return cls("json_schema", schema)
        if wanted in ("json", "json_object", "json_schema"):
            return cls("json_object", schema)
        return cls()

    def parse(self, text: str) -> dict[str, Any] | Invalid:
        """The final answer as the role's output, or why it is not usable."""
        if not self.structured:
            return {"text": text}
        parsed = parse_json_lenient(text)
        if isinstance(parsed, Invalid) or not text.strip():
            return Invalid("it is not valid JSON.")
        if not isinstance(parsed.value, dict):
            return Invalid("it must be a JSON object.")
        if self.schema is not None:
            errors = [e.message for e in validator_for(self.schema).iter_errors(parsed.value)]
            if errors:
                return Invalid(f"it does not match the required schema ({'; '.join(errors[:5])}).")
        return parsed.value
