from __future__ import annotations

from loops.roles import judge_verdict


def verdict(value: str = "pass", checks: list[dict] | None = None) -> dict:
    return {"verdict": value, "reasons": ["r"], "checks": checks if checks is not None else []}


def test_a_clean_pass_stays_a_pass() -> None:
    checks = [{"name": "tests", "passed": True, "evidence": ["7"]}]
    assert judge_verdict(
        verdict(checks=checks), required_checks=["tests"], run_artifact_ids={"7"}
    ) == ("pass", [])


def test_a_missing_required_check_turns_a_pass_into_an_escalation() -> None:
    value, problems = judge_verdict(verdict(), required_checks=["tests"], run_artifact_ids=set())
    assert value == "escalate"
    assert problems == ["required check 'tests' is missing"]


def test_evidence_from_outside_the_run_turns_a_pass_into_an_escalation() -> None:
    checks = [{"name": "tests", "passed": True, "evidence": ["99"]}]
    value, problems = judge_verdict(
        verdict(checks=checks), required_checks=[], run_artifact_ids={"7"}
    )
    assert value == "escalate" and "not an artifact of this run" in problems[0]


def test_a_failed_required_check_cannot_pass() -> None:
    checks = [{"name": "tests", "passed": False}]
    assert (
        judge_verdict(verdict(checks=checks), required_checks=["tests"], run_artifact_ids=set())[0]
        == "escalate"
    )


def test_a_reject_stays_a_reject_even_with_problems() -> None:
    assert (
        judge_verdict(verdict("reject"), required_checks=["tests"], run_artifact_ids=set())[0]
        == "reject"
    )


def test_an_invalid_verdict_escalates() -> None:
    assert (
        judge_verdict({"verdict": "maybe"}, required_checks=[], run_artifact_ids=set())[0]
        == "escalate"
    )
    assert judge_verdict("not json", required_checks=[], run_artifact_ids=set())[0] == "escalate"
