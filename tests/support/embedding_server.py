"""A real OpenAI-compatible embeddings server on 127.0.0.1 (``POST /v1/embeddings``): a
deterministic bag-of-words hashing embedder, so texts sharing words have close vectors.

Each lower-cased word (E5 prefixes ``query:`` / ``passage:`` dropped first) adds ±1 to one of
``dims`` coordinates chosen by a hash of the model name and the word, so another model gives
other vectors. Every request is recorded (``requests``: path, headers, body); ``fail_next``
makes the next answers HTTP 500, ``wrong_dims`` answers vectors of another length.

Usage::

    def test_something(embedding_server):
        base = KnowledgeBase(embedding_url=embedding_server.url, embedding_model="bow", ...)

or, outside pytest, ``with EmbeddingServer() as server: ...`` (``server.url`` ends in ``/v1``).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

EMBEDDINGS_PATH = "/v1/embeddings"
DEFAULT_DIMS = 64
_WORD = re.compile(r"\w+")
_E5 = re.compile(r"^(query|passage): ")


@dataclass(frozen=True)
class EmbeddingRequest:
    path: str
    headers: dict[str, str]
    body: Any


def bow_vector(text: str, *, model: str = "bow", dims: int = DEFAULT_DIMS) -> list[float]:
    """The embedder's vector of ``text`` (not normalised; the client normalises)."""
    vector = [0.0] * dims
    for word in _WORD.findall(_E5.sub("", text).lower()):
        digest = hashlib.blake2b(f"{model}\x00{word}".encode(), digest_size=8).digest()
        index = int.from_bytes(digest[:4], "little") % dims
        vector[index] += 1.0 if digest[4] & 1 else -1.0
    if not any(vector):
        vector[0] = 1e-3  # never a zero vector
    return vector


class _Handler(BaseHTTPRequestHandler):
    server: _EmbeddingHTTPServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body leave at once (no delayed-ACK wait)

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = None
        owner = self.server.owner
        headers = {key.lower(): value for key, value in self.headers.items()}
        with owner.lock:
            owner.requests.append(EmbeddingRequest(self.path, headers, body))
            failing = owner.fail_next > 0
            owner.fail_next -= failing
        if self.path != EMBEDDINGS_PATH:
            return self._reply(404, {"error": {"message": f"no route {self.path}"}})
        if failing:
            return self._reply(500, {"error": {"message": "embedding server down (test)"}})
        if owner.api_key and headers.get("authorization") != f"Bearer {owner.api_key}":
            return self._reply(401, {"error": {"message": "bad key"}})
        inputs = body.get("input") if isinstance(body, dict) else None
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not all(isinstance(x, str) for x in inputs):
            return self._reply(400, {"error": {"message": "input must be strings"}})
        model = str(body.get("model") or "bow")
        dims = owner.wrong_dims or owner.dims
        data = [
            {"object": "embedding", "index": i, "embedding": bow_vector(t, model=model, dims=dims)}
            for i, t in enumerate(inputs)
        ]
        self._reply(200, {"object": "list", "data": data, "model": model})

    def _reply(self, code: int, payload: Any) -> None:
        raw = json.dumps(payload).encode()
        self.send_response(code)
        self.close_connection = True  # no kept-alive socket outlives the server
        self.send_header("Connection", "close")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


class _EmbeddingHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    owner: EmbeddingServer


class EmbeddingServer:
    """The server, started on enter (a free port on 127.0.0.1), stopped on exit."""

    def __init__(self, *, dims: int = DEFAULT_DIMS, api_key: str = "") -> None:
        self.dims = dims
        self.api_key = api_key
        self.wrong_dims = 0
        self.fail_next = 0
        self.requests: list[EmbeddingRequest] = []
        self.lock = threading.Lock()
        self._http = _EmbeddingHTTPServer(("127.0.0.1", 0), _Handler)
        self._http.owner = self
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        """The OpenAI-compatible base URL (``POST {url}/embeddings``)."""
        return f"http://127.0.0.1:{self._http.server_address[1]}/v1"

    def inputs(self) -> list[str]:
        """Every text embedded so far, in order."""
        with self.lock:
            return [t for r in self.requests if isinstance(r.body, dict) for t in r.body["input"]]

    def __enter__(self) -> EmbeddingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture
def embedding_server() -> Iterator[EmbeddingServer]:
    with EmbeddingServer() as server:
        yield server
