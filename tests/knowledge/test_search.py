"""``knowledge_search`` over real bases: the access matrix (a refusal names it and is recorded),
one Retrieval per call, hybrid ranking with the loopback embedding server, an ``e5-http`` base
(E5 prefixes), an ``external-http`` provider on loopback (its contract, malformed answers and
HTTP errors recorded as failures), and re-embedding after a model change."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from knowledge import vectors
from knowledge.models import KnowledgeChunk, Retrieval
from knowledge.ranking import Ranked, fuse
from knowledge.search import KnowledgeRefused, knowledge_search
from knowledge.services_bases import base_update, knowledge_reembed
from tests.knowledge.kb_support import allow, local_base, put
from tests.support.embedding_server import EmbeddingServer, embedding_server

pytestmark = pytest.mark.django_db
__all__ = ["embedding_server"]
RUN = uuid.UUID("00000000-0000-4000-8000-0000000000b1")
LEAVE = "Employees take thirty days of paid leave a year; unused days carry over to March."
DEPLOY = "Deploys go out on Tuesdays after the release review; hotfixes any time."
SALARY = "The salary bands of 2025 are confidential."
KEY_ENV = "LOOPWRIGHT_SECRET_KB_TEST"


@pytest.fixture(autouse=True)
def _fresh_vectors() -> Iterator[None]:
    vectors.forget()
    yield
    vectors.forget()


# --- the access matrix and retrievals -----------------------------------------------------------


def test_a_base_the_employee_may_not_read_is_refused_naming_the_matrix() -> None:
    handbook, contracts = local_base("handbook"), local_base("contracts")
    put(handbook, "leave.md", LEAVE)
    put(contracts, "salary.md", SALARY)
    allow(handbook, "ada")
    with pytest.raises(KnowledgeRefused) as refused:
        knowledge_search(employee="ada", query="salary", bases=["handbook", "contracts"],
                         top_k=3, run_id=RUN, invocation="maker")  # fmt: skip
    assert refused.value.code == "no_access"
    assert refused.value.message == (
        'employee "ada" may not read knowledge base "contracts" (knowledge access matrix)'
    )
    row = Retrieval.objects.get()
    assert row.error == refused.value.message and row.hits == [] and row.employee == "ada"
    assert (
        row.run_id == RUN and row.invocation == "maker" and row.bases == ["handbook", "contracts"]
    )


def test_without_bases_an_employee_searches_every_base_it_may_read() -> None:
    handbook, contracts = local_base("handbook"), local_base("contracts")
    put(handbook, "leave.md", LEAVE + " salary")
    put(contracts, "salary.md", SALARY)
    allow(handbook, "ada")
    outcome = knowledge_search(employee="ada", query="salary", bases=None, top_k=5, user="bob",
                               run_id=RUN, invocation="maker", chat=False)  # fmt: skip
    assert outcome.bases == ["handbook"]
    assert [hit.base for hit in outcome.hits] == ["handbook"]
    row = Retrieval.objects.get()
    assert (row.employee, row.user, row.tool, row.mode, row.error) == (
        "ada",
        "bob",
        "knowledge_search",
        "fulltext",
        "",
    )
    assert row.hits[0]["document"] == "leave.md" and row.hits[0]["base"] == "handbook"
    assert row.hits[0]["chunk"] == outcome.hits[0].chunk_id and row.hits[0]["score"] > 0
    assert row.latency_ms >= 0
    nothing = knowledge_search(employee="nobody", query="salary", bases=None, top_k=5)
    assert nothing.hits == [] and nothing.bases == []


@pytest.mark.parametrize(
    ("query", "bases", "top_k", "code"),
    [
        ("", None, 5, "invalid"),
        ("   ", None, 5, "invalid"),
        ("x" * 2001, None, 5, "invalid"),
        ("leave", None, 0, "invalid"),
        ("leave", None, 51, "invalid"),
        ("leave", ["missing"], 5, "unknown_base"),
    ],
)
def test_bad_searches_are_refused_and_recorded(
    query: str, bases: list[str] | None, top_k: int, code: str
) -> None:
    with pytest.raises(KnowledgeRefused) as refused:
        knowledge_search(employee="ada", query=query, bases=bases, top_k=top_k)
    assert refused.value.code == code
    assert Retrieval.objects.get().error == refused.value.message


# --- hybrid ranking -----------------------------------------------------------------------------


def test_reciprocal_rank_fusion_rewards_agreement() -> None:
    text = [Ranked("a", 9, "fulltext"), Ranked("b", 5, "fulltext"), Ranked("c", 1, "fulltext")]
    vector = [Ranked("b", 0.9, "vector"), Ranked("d", 0.8, "vector"), Ranked("e", 0.1, "vector")]
    fused = fuse([text, vector], 4)
    assert [item.key for item in fused] == ["b", "a", "d", "c"]  # c before e: its own score
    assert fused[0].scores == {"fulltext": 5, "vector": 0.9}
    assert fuse([text], 2)[0].native == 9


def test_a_base_with_embeddings_searches_hybrid(embedding_server: EmbeddingServer) -> None:
    base = local_base("hybrid", embedding_url=embedding_server.url, embedding_model="bow",
                      embedding_dims=64)  # fmt: skip
    stored = put(base, "leave.md", LEAVE)
    put(base, "deploy.md", DEPLOY)
    put(base, "salary.md", SALARY)
    assert stored.embedding_error == ""
    chunk = KnowledgeChunk.objects.get(document=stored.document)
    assert chunk.embedded_model == "bow@64" and len(bytes(chunk.embedding or b"")) == 64 * 4
    outcome = knowledge_search(employee="", query="when do deploys go out", bases=["hybrid"],
                               top_k=3)  # fmt: skip
    assert outcome.mode == "hybrid"
    assert outcome.hits[0].document == "deploy.md"
    assert set(outcome.hits[0].source["scores"]) == {"fulltext", "vector"}
    assert embedding_server.inputs()[-1] == "when do deploys go out"
    assert Retrieval.objects.get().mode == "hybrid"


def test_a_failing_embedding_endpoint_degrades_to_full_text(
    embedding_server: EmbeddingServer,
) -> None:
    base = local_base("degrade", embedding_url=embedding_server.url, embedding_model="bow")
    embedding_server.fail_next = 1
    stored = put(base, "leave.md", LEAVE)
    assert "500" in stored.embedding_error
    assert KnowledgeChunk.objects.get().embedding is None
    embedding_server.fail_next = 1
    outcome = knowledge_search(employee="", query="leave", bases=["degrade"], top_k=3)
    assert outcome.mode == "fulltext" and outcome.hits[0].document == "leave.md"
    assert knowledge_reembed(base) == 1  # the chunks stored without vectors get them
    assert knowledge_search(employee="", query="leave", bases=["degrade"], top_k=3).mode == "hybrid"


def test_wrong_dimensions_are_refused(embedding_server: EmbeddingServer) -> None:
    base = local_base("dims", embedding_url=embedding_server.url, embedding_model="bow",
                      embedding_dims=64)  # fmt: skip
    embedding_server.wrong_dims = 32
    assert "32 dimensions, not 64" in put(base, "leave.md", LEAVE).embedding_error


def test_the_embedding_key_comes_from_its_allowed_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with EmbeddingServer(api_key="s3cret") as server:
        base = local_base("keyed", embedding_url=server.url, embedding_model="bow",
                          embedding_key_env=KEY_ENV)  # fmt: skip
        assert "not set" in put(base, "a.md", LEAVE).embedding_error
        monkeypatch.setenv(KEY_ENV, "s3cret")
        assert put(base, "b.md", DEPLOY).embedding_error == ""
        assert server.requests[-1].headers["authorization"] == "Bearer s3cret"


def test_reembedding_after_a_model_change(embedding_server: EmbeddingServer) -> None:
    base = local_base("reembed", embedding_url=embedding_server.url, embedding_model="bow-a")
    put(base, "leave.md", LEAVE)
    put(base, "deploy.md", DEPLOY)
    before = {c.pk: bytes(c.embedding or b"") for c in KnowledgeChunk.objects.all()}
    base = base_update(base=base, embedding_model="bow-b")
    # until re-embedded, the old vectors are not compared with the new model's query vector
    assert vectors.nearest(base.pk, base.model_stamp, [1.0] * 64, 5) == []
    assert knowledge_reembed(base) == 2
    assert knowledge_reembed(base) == 0
    after = {c.pk: bytes(c.embedding or b"") for c in KnowledgeChunk.objects.all()}
    assert set(after) == set(before) and all(after[pk] != before[pk] for pk in after)
    assert set(KnowledgeChunk.objects.values_list("embedded_model", flat=True)) == {"bow-b@0"}
    base.refresh_from_db()
    assert base.embedded_model == "bow-b@0"
    hits = knowledge_search(employee="", query="deploys tuesdays", bases=["reembed"], top_k=1)
    assert hits.mode == "hybrid" and hits.hits[0].document == "deploy.md"


def test_an_e5_base_prefixes_passages_and_queries(embedding_server: EmbeddingServer) -> None:
    base = local_base("e5", kind="external_rag", provider="e5-http",
                      embedding_url=embedding_server.url, embedding_model="e5-small")  # fmt: skip
    put(base, "leave.md", LEAVE)
    put(base, "deploy.md", DEPLOY)
    assert all(text.startswith("passage: ") for text in embedding_server.inputs())
    outcome = knowledge_search(employee="", query="paid leave", bases=["e5"], top_k=2,
                               tool="external_rag_search")  # fmt: skip
    assert embedding_server.inputs()[-1] == "query: paid leave"
    assert outcome.mode == "hybrid" and outcome.hits[0].document == "leave.md"
    assert Retrieval.objects.get().tool == "external_rag_search"


# --- an external-http provider on loopback -------------------------------------------------------


class _RagHandler(BaseHTTPRequestHandler):
    server: _RagServer

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.server.seen.append((self.path, dict(self.headers.items()), body))
        status, answer = self.server.answer
        raw = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


class _RagServer(ThreadingHTTPServer):
    daemon_threads = True
    seen: list[tuple[str, dict[str, str], Any]]
    answer: tuple[int, Any]


RESULTS = {"results": [
    {"id": "r1", "content": "Leave is thirty days.", "score": 0.92,
     "metadata": {"fileId": "f-1", "filename": "leave.pdf", "sourceUrl": "https://x/leave"}},
    {"id": 7, "content": "Deploys on Tuesdays.", "score": 0.4,
     "metadata": {"collection": "ops", "recordId": "rec-7"}},
    {"id": "r3", "content": "Below the threshold.", "score": 0.1},
]}  # fmt: skip


@pytest.fixture
def rag() -> Iterator[_RagServer]:
    server = _RagServer(("127.0.0.1", 0), _RagHandler)
    server.seen, server.answer = [], (200, RESULTS)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _external(rag: _RagServer, **fields: Any) -> None:
    port = rag.server_address[1]
    local_base("remote", kind="external_rag", provider="external-http",
               api_url=f"http://127.0.0.1:{port}/rag", api_key_env=KEY_ENV, namespace="hr",
               score_threshold=0.2, top_k=5, **fields)  # fmt: skip


def test_the_external_http_contract(rag: _RagServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "rag-key")
    _external(rag)
    allow(local_base("unused"), "ada")
    from knowledge.services_bases import knowledge_access_grant

    knowledge_access_grant(employee="ada", base="remote")
    outcome = knowledge_search(employee="ada", query="leave?", bases=["remote"], top_k=3,
                               tool="external_rag_search")  # fmt: skip
    path, headers, body = rag.seen[-1]
    assert path == "/rag/search"
    assert headers["Authorization"] == "Bearer rag-key"
    assert body == {"query": "leave?", "topK": 3, "scoreThreshold": 0.2, "namespace": "hr",
                    "filter": {}}  # fmt: skip
    assert outcome.mode == "external"
    assert [hit.chunk_id for hit in outcome.hits] == ["remote:r1", "remote:7"]
    first = outcome.hits[0]
    assert (first.document, first.text, first.score) == ("leave.pdf", "Leave is thirty days.", 0.92)
    assert first.source["fileId"] == "f-1" and first.source["sourceUrl"] == "https://x/leave"
    assert outcome.hits[1].source["recordId"] == "rec-7"
    assert Retrieval.objects.get().hits[0]["source"]["filename"] == "leave.pdf"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ((500, {"error": "down"}), "HTTP 500"),
        ((401, {}), "HTTP 401"),
        ((200, b"not json"), "not JSON"),
        ((200, {"hits": []}), 'no "results" list'),
        ((200, {"results": [{"id": "x", "content": 5, "score": 1}]}), "content is not a string"),
        (
            (200, {"results": [{"id": "x", "content": "c", "score": "high"}]}),
            "score is not a number",
        ),
        ((200, {"results": [{"id": None, "content": "c", "score": 1}]}), "id is not"),
        ((200, {"results": ["x"]}), "not an object"),
        ((200, {"results": [{"id": "x", "content": "c", "score": 1, "metadata": []}]}), "metadata"),
    ],
)
def test_a_failing_provider_is_a_recorded_failure(
    rag: _RagServer, monkeypatch: pytest.MonkeyPatch, answer: tuple[int, Any], expected: str
) -> None:
    monkeypatch.setenv(KEY_ENV, "rag-key")
    _external(rag)
    rag.answer = answer
    with pytest.raises(KnowledgeRefused) as refused:
        knowledge_search(employee="", query="leave", bases=["remote"], top_k=3)
    assert refused.value.code == "provider_failed"
    assert expected in refused.value.message and "rag-key" not in refused.value.message
    assert Retrieval.objects.get().error == refused.value.message


def test_an_unset_provider_key_fails_before_calling(rag: _RagServer) -> None:
    _external(rag)
    with pytest.raises(KnowledgeRefused, match="LOOPWRIGHT_SECRET_KB_TEST is not set"):
        knowledge_search(employee="", query="leave", bases=["remote"], top_k=3)
    assert rag.seen == []


def test_local_and_external_bases_fuse(rag: _RagServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "rag-key")
    _external(rag)
    put(local_base("handbook"), "leave.md", LEAVE)
    outcome = knowledge_search(employee="", query="leave", bases=["handbook", "remote"], top_k=5)
    assert {hit.base for hit in outcome.hits} == {"handbook", "remote"}
    assert outcome.mode == "fulltext"
