"""What each role must return: the leader's plan and the verifier's verdict (JSON Schemas), and
the rule that turns an incomplete verdict into an escalation."""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator

PLAN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "tasks": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {"title": {"type": "string"}, "detail": {"type": "string"}},
                "required": ["title"],
            },
        },
        "notes": {"type": "string"},
    },
    "required": ["tasks"],
}

VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["pass", "reject", "escalate"]},
        "reasons": {"type": "array", "items": {"type": "string"}},
        "checks": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "passed": {"type": "boolean"},
                    "evidence": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["name", "passed"],
            },
        },
    },
    "required": ["verdict", "reasons", "checks"],
}

_verdict_validator = Draft202012Validator(VERDICT_SCHEMA)


def judge_verdict(
    verdict: Any, *, required_checks: list[str], run_artifact_ids: set[str]
) -> tuple[str, list[str]]:
    """The verdict that counts and why: ``pass`` only with every required check passed and
    every piece of evidence an artifact of this run; an invalid verdict escalates."""
    errors = sorted(e.message for e in _verdict_validator.iter_errors(verdict))
    if errors:
        return "escalate", [f"invalid verdict: {errors[0]}"]
    value = str(verdict["verdict"])
    problems: list[str] = []
    names = {c["name"]: c for c in verdict["checks"]}
    for required in required_checks:
        if required not in names:
            problems.append(f"required check '{required}' is missing")
    for check in verdict["checks"]:
        foreign = [e for e in check.get("evidence", []) if str(e) not in run_artifact_ids]
        if foreign:
            problems.append(
                f"check '{check['name']}' cites evidence that is not an artifact of this run: "
                f"{foreign}"
            )
    if value == "pass":
        failed = [
            c["name"] for c in verdict["checks"] if not c["passed"] and c["name"] in required_checks
        ]
        problems.extend(f"required check '{name}' did not pass" for name in failed)
    if problems and value != "reject":
        return "escalate", problems
    return value, problems
