"""The probes and the log lines: ``/readyz`` answers for the database, the broker and Redis
(503 naming what failed), and ``LOG_FORMAT=json`` writes one JSON object per line with the
request id of the request being served and the run id of the run being driven."""

from __future__ import annotations

import io
import json
import logging

import pytest
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings

from orchestrator.logcontext import RUN_ID, log_format
from orchestrator.middleware import RequestIdMiddleware
from tests.support.logs import json_lines

__all__ = ["json_lines"]
pytestmark = pytest.mark.django_db


def test_readyz_checks_the_database_the_broker_and_redis(client: Client) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ok" and body["database"] in ("sqlite", "postgresql")
    assert body["broker"]
    assert body["redis"] == ("ok" if settings.REDIS_URL else "not configured")
    assert client.get("/healthz").json() == {"status": "ok", "database": body["database"]}


def test_readyz_names_a_dependency_that_does_not_answer(client: Client) -> None:
    with override_settings(REDIS_URL="redis://127.0.0.1:9/0"):  # nothing listens on port 9
        response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "error" and body["redis"].startswith("error: ")
    assert body["database"] in ("sqlite", "postgresql")


def test_json_lines_carry_the_request_id_of_the_request(json_lines: io.StringIO) -> None:
    def view(request: HttpRequest) -> HttpResponse:
        logging.getLogger("loops.api").info("serving")
        return HttpResponse("ok")

    request = RequestFactory().get("/api/v1/runs", HTTP_X_REQUEST_ID="req-42")
    response = RequestIdMiddleware(view)(request)
    assert response["X-Request-ID"] == "req-42"
    logging.getLogger("after").warning("outside any request")
    served, after = (json.loads(line) for line in json_lines.getvalue().splitlines()[-2:])
    assert served["request_id"] == "req-42" and served["message"] == "serving"
    assert {"ts", "level", "logger", "message"} <= set(served)
    assert "request_id" not in after


def test_json_lines_carry_the_run_id_and_tracebacks(json_lines: io.StringIO) -> None:
    token = RUN_ID.set("0190-run")
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("loops.worker").exception("driver error")
    finally:
        RUN_ID.reset(token)
    line = json.loads(json_lines.getvalue().splitlines()[-1])
    assert line["run_id"] == "0190-run" and line["message"] == "driver error"
    assert "ValueError: boom" in line["exc"]


def test_log_format_is_plain_or_json() -> None:
    assert (log_format(None), log_format("JSON")) == ("plain", "json")
    with pytest.raises(ValueError, match="LOG_FORMAT must be one of plain, json"):
        log_format("xml")
