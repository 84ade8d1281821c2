"""What ``loopwright`` knows of the REST API: a thin client, its errors and its exit codes.

No Django and nothing of the project (``bin/loopwright`` runs the CLI as a bare file).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2

DEFAULT_URL = "http://127.0.0.1:8000"
#: A stream sends a heartbeat every 15 s: a read waiting longer has lost its server.
STREAM_TIMEOUT = httpx2.Timeout(10.0, read=45.0)
#: 0 done (the run succeeded, the decision was taken), 1 an error (bad arguments, configuration,
#: network, the API refused), 2 the run ended otherwise or is parked, 130 interrupted.
EXIT_OK, EXIT_ERROR, EXIT_NOT_SUCCEEDED, EXIT_INTERRUPTED = 0, 1, 2, 130


class CliError(Exception):
    """Something to tell the user, then exit 1. ``transient``: worth retrying (network, 5xx);
    ``status``: the HTTP status of the API's refusal, if that is what it is."""

    def __init__(self, message: str, *, transient: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status


def _problem_text(response: httpx2.Response) -> str:
    """A problem+json body as 'title: detail' plus one line per field error."""
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:300]}"
    if not isinstance(body, dict):
        return f"HTTP {response.status_code}: {str(body)[:300]}"
    title = body.get("title") or f"HTTP {response.status_code}"
    lines = [f"{title}: {body.get('detail', '')}".rstrip(": ")]
    for error in body.get("errors") or []:
        if isinstance(error, dict):
            where = str(error.get("pointer") or "").lstrip("/").replace("/", ".") or "body"
            lines.append(f"  {where}: {error.get('detail', '')}")
    return "\n".join(lines)


@dataclass
class Api:
    """A thin client of the Loopwright REST API."""

    url: str
    token: str
    client: httpx2.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = httpx2.Client(
            base_url=self.url.rstrip("/"),
            headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"},
            timeout=httpx2.Timeout(10.0),
        )

    def page_url(self, run_id: str) -> str:
        """The run's page in the UI: the server this CLI talks to, ``/runs/<id>``."""
        return f"{self.url.rstrip('/')}/runs/{run_id}"

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.client.request(method, f"/api/v1/{path}", **kwargs)
        except httpx2.TransportError as exc:
            raise CliError(
                f"Cannot reach Loopwright at {self.url} (LOOPWRIGHT_URL): {exc}", transient=True
            ) from exc
        if response.status_code >= 400:
            raise CliError(
                _problem_text(response),
                transient=response.status_code >= 500,
                status=response.status_code,
            )
        return response.json()

    def lines(self, path: str, headers: dict[str, str], params: dict[str, Any]) -> Iterator[str]:
        """The lines of a streamed answer (server-sent events); a refusal raises CliError."""
        try:
            with self.client.stream(
                "GET", f"/api/v1/{path}", headers=headers, params=params, timeout=STREAM_TIMEOUT
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise CliError(
                        _problem_text(response),
                        transient=response.status_code >= 500,
                        status=response.status_code,
                    )
                yield from response.iter_lines()
        except httpx2.ConnectError as exc:
            raise CliError(
                f"Cannot reach Loopwright at {self.url} (LOOPWRIGHT_URL): {exc}", transient=True
            ) from exc
        except httpx2.TransportError as exc:
            raise CliError(f"Lost the stream from {self.url}: {exc}", transient=True) from exc

    def close(self) -> None:
        self.client.close()


def uuid_argument(name: str, value: str, what: str) -> str:
    """``value`` when it is a UUID, else a CliError naming the argument."""
    try:
        uuid.UUID(value)
    except ValueError as exc:
        raise CliError(f"argument {name}: {value!r} is not {what} (a UUID).") from exc
    return value


def api_from_env(environ: dict[str, str] | None = None) -> Api:
    env = os.environ if environ is None else environ
    token = env.get("LOOPWRIGHT_TOKEN", "").strip()
    if not token:
        raise CliError(
            "LOOPWRIGHT_TOKEN is not set: export LOOPWRIGHT_TOKEN=<API token> "
            "(create one with `manage.py create_api_token <username> --role operator`)."
        )
    return Api(url=env.get("LOOPWRIGHT_URL", "").strip() or DEFAULT_URL, token=token)
