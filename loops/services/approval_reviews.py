"""The review of a gated call (docs/approvals.md): the forms its approval captures when it
opens, the review a decision must carry, and what the model is told of it.

Holds: an approval whose tool asked for a review (``review_schema``, captured when it opened,
so the decision is judged by the schema the reviewer saw) is decided, approved or rejected,
only with a review valid against that schema; an approval without one refuses a review rather
than ignore it. The model gets the review with the call's result, or with its rejection.
The tool's schemas come from its spec (``runtime.tools.specs``): ``loops`` never reads a
skill's rows.
"""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator

from loops.models import ActionApproval
from orchestrator.errors import InvalidInput
from runtime.tools.specs import tool_spec

#: The longest review (as compact JSON) an approval keeps and a model is shown.
MAX_REVIEW_CHARS = 20_000


def approval_forms(tool: str, kind: str | None) -> tuple[Any, Any]:
    """``(interaction_schema, review_schema)`` of a gated call of ``tool``, as its spec declares
    them now; a question a call asked (``kind`` ``input``) is answered, never reviewed."""
    spec = tool_spec(tool)
    if spec is None:
        return None, None
    return spec.interaction_schema, None if kind == "input" else spec.review_schema


def _escaped(part: Any) -> str:
    return str(part).replace("~", "~0").replace("/", "~1")


def _missing(error: Any) -> list[str]:
    """The property a ``required`` error is about (its message names it first)."""
    names = error.validator_value if isinstance(error.validator_value, list) else []
    return [n for n in names if isinstance(n, str) and error.message.startswith(repr(n))][:1]


def schema_errors(schema: Any, value: Any, root: str) -> list[dict[str, str]]:
    """``value``'s problems against ``schema`` as ``{pointer, detail, code}`` under ``root``,
    a missing required property named by its own pointer (so a form shows it at its field)."""
    found = []
    for error in Draft202012Validator(schema).iter_errors(value):
        path = [*error.absolute_path]
        if error.validator == "required":
            path.extend(_missing(error))
        pointer = root + "".join(f"/{_escaped(p)}" for p in path)
        found.append({"pointer": pointer, "detail": error.message, "code": str(error.validator)})
    return found


def review_checked(approval: ActionApproval, review: Any) -> Any:
    """The review to store with the decision: required and valid when the approval has a review
    schema, refused when it has none (nothing the platform would not enforce is accepted)."""
    schema = approval.review_schema
    if schema is None:
        if review is None:
            return None
        raise InvalidInput(
            "This call asks for no review: decide it without one.",
            errors=[{"pointer": "/review", "detail": "no review schema", "code": "not_allowed"}],
        )
    if review is None:
        raise InvalidInput(
            "This call's review is part of the decision: fill the review.",
            errors=[{"pointer": "/review", "detail": "required", "code": "required"}],
        )
    if len(json.dumps(review, separators=(",", ":"))) > MAX_REVIEW_CHARS:
        raise InvalidInput(
            f"The review is longer than {MAX_REVIEW_CHARS} characters (as JSON).",
            errors=[{"pointer": "/review", "detail": "too long", "code": "max_length"}],
        )
    errors = schema_errors(schema, review, "/review")
    if errors:
        first = errors[0]
        raise InvalidInput(
            f"The review does not fit its schema: {first['pointer']}: {first['detail']}",
            errors=errors,
        )
    return review


def review_text(approval: ActionApproval) -> str:
    """The review as the model is told it ("" for none)."""
    if approval.review is None:
        return ""
    shown = json.dumps(approval.review, ensure_ascii=False, sort_keys=True)
    return f"Review by {approval.decided_by}: {shown}"
