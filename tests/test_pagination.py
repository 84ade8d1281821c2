"""List pages at the REST edge: ``count`` is exact up to ``COUNT_LIMIT`` and null past it, and
``next`` links a further page exactly when one exists (orchestrator/pagination.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from loops.models import RunStatus
from orchestrator import pagination
from tests.support.factories import make_pattern, make_run


@pytest.fixture
def operator(api_client_for: Callable[[str], APIClient]) -> APIClient:
    return api_client_for("operator")


def _runs(n: int, status: str = RunStatus.SUCCEEDED) -> None:
    pattern = make_pattern(key="paged")
    for _ in range(n):
        make_run(pattern, status=status)


def _page(client: APIClient, **query: Any) -> dict[str, Any]:
    answer = client.get("/api/v1/runs", {k: str(v) for k, v in query.items()})
    assert answer.status_code == 200, answer.content
    page: dict[str, Any] = answer.json()
    return page


def _walk(client: APIClient, limit: int) -> list[str]:
    """Every run id, following ``next`` from the first page."""
    ids: list[str] = []
    url: str | None = f"/api/v1/runs?limit={limit}"
    while url:
        page = client.get(url).json()
        ids += [run["id"] for run in page["results"]]
        url = page["next"]
    return ids


@pytest.mark.django_db
class TestBoundedCount:
    def test_count_is_exact_up_to_the_limit(
        self, operator: APIClient, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(pagination, "COUNT_LIMIT", 5)
        _runs(5)
        page = _page(operator, limit=2)
        assert (page["count"], len(page["results"])) == (5, 2)
        assert page["next"] is not None and page["previous"] is None

    def test_count_is_null_past_the_limit_and_next_still_pages(
        self, operator: APIClient, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(pagination, "COUNT_LIMIT", 5)
        _runs(7)
        page = _page(operator, limit=3)
        assert page["count"] is None and len(page["results"]) == 3
        ids = _walk(operator, limit=3)
        assert len(ids) == len(set(ids)) == 7
        last = _page(operator, limit=3, offset=6)
        assert (last["count"], last["next"], len(last["results"])) == (7, None, 1)

    def test_filtered_count_counts_the_matches_only(
        self, operator: APIClient, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(pagination, "COUNT_LIMIT", 5)
        _runs(8, RunStatus.SUCCEEDED)
        make_run(make_pattern(key="other"), status=RunStatus.FAILED)
        assert _page(operator, status="failed", limit=1)["count"] == 1
        assert _page(operator, status="succeeded", limit=1)["count"] is None

    def test_a_page_exactly_full_has_no_next(self, operator: APIClient) -> None:
        _runs(4)
        page = _page(operator, limit=4)
        assert (page["count"], page["next"]) == (4, None)
        assert _page(operator, limit=2, offset=2)["next"] is None

    def test_past_the_end_is_empty_with_the_count(self, operator: APIClient) -> None:
        _runs(3)
        page = _page(operator, limit=2, offset=10)
        assert (page["count"], page["results"], page["next"]) == (3, [], None)
        assert page["previous"] is not None

    def test_the_last_page_sends_no_count_query(self, operator: APIClient) -> None:
        _runs(3)
        with CaptureQueriesContext(connection) as queries:
            page = _page(operator, limit=10)
        assert page["count"] == 3
        assert not [q for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]

    def test_the_count_query_reads_at_most_limit_plus_one_rows(
        self, operator: APIClient, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(pagination, "COUNT_LIMIT", 5)
        _runs(7)
        with CaptureQueriesContext(connection) as queries:
            _page(operator, limit=2)
        (count,) = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
        assert "LIMIT 6" in count and "ORDER BY" not in count
