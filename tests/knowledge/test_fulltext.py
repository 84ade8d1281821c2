"""Full-text search on the suite's database (SQLite FTS5 or PostgreSQL ``tsvector``): stemmed
words found and ranked, chunks kept in sync on replace and delete, and hostile query strings
that never break the query syntax."""

from __future__ import annotations

import pytest
from django.db import connection

from knowledge.fulltext import fts5_match, ranked_chunks, terms
from knowledge.models import KnowledgeChunk, KnowledgeDocument
from knowledge.search import knowledge_search
from knowledge.services import document_delete
from tests.knowledge.kb_support import local_base, put

pytestmark = pytest.mark.django_db
LEAVE = "Employees take thirty days of paid leave a year; unused days carry over to March."
DEPLOY = "Deploys go out on Tuesdays after the release review; hotfixes are deployed any day."
HOSTILE = [
    '"', '""', '"unterminated', "*", "a*", "NEAR(a b)", "AND", "OR NOT", "a AND OR b", ":",
    "col:leave", "^leave", "-leave", "+leave", "(", ")(", "{}", "[]", "'", "''", "\\",
    "'; DROP TABLE knowledge_knowledgechunk; --", "leave\x00", "\u202e\u0000", "🙂 leave",
    "\u017ftra\u00dfe", "%", "%s", "%(x)s", "&|!<->", "leave:*", "!leave", "a" * 5000, "NEAR/2",
    "knowledge_chunk_fts", "rank:1", "bm25(", "leave OR", "OR", '"leave" "days',
]  # fmt: skip


def test_words_are_found_by_their_stem_and_ranked() -> None:
    base = local_base("handbook")
    put(base, "leave.md", LEAVE)
    put(base, "deploy.md", DEPLOY)
    put(base, "both.md", LEAVE + "\n\n" + DEPLOY)
    found = ranked_chunks([base.pk], "deploying hotfix", 10)
    names = [KnowledgeChunk.objects.get(pk=pk).document.name for pk, _ in found]
    assert set(names) == {"deploy.md", "both.md"}
    assert all(score > 0 for _, score in found)
    outcome = knowledge_search(employee="", query="paid leave", bases=["handbook"], top_k=5)
    assert outcome.mode == "fulltext"
    assert outcome.hits[0].document == "leave.md"  # the denser match first
    assert {hit.document for hit in outcome.hits} == {"leave.md", "both.md"}
    assert outcome.hits[0].source["seq"] == 0 and outcome.hits[0].source["base"] == "handbook"


def test_only_the_named_bases_are_searched() -> None:
    one, two = local_base("one"), local_base("two")
    put(one, "a.md", LEAVE)
    put(two, "b.md", LEAVE)
    assert {hit.base for hit in knowledge_search(
        employee="", query="leave", bases=["two"], top_k=5).hits} == {"two"}  # fmt: skip


def test_a_replaced_or_deleted_document_leaves_no_stale_match() -> None:
    base = local_base("sync")
    put(base, "doc.md", LEAVE)
    assert ranked_chunks([base.pk], "leave", 5)
    stored = put(base, "doc.md", DEPLOY)
    assert stored.changed
    assert ranked_chunks([base.pk], "leave", 5) == []
    assert len(ranked_chunks([base.pk], "deploys", 5)) == 1
    again = put(base, "doc.md", DEPLOY)
    assert not again.changed
    document_delete(KnowledgeDocument.objects.get(base=base, name="doc.md"))
    assert ranked_chunks([base.pk], "deploys", 5) == []


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_query_strings_never_break_the_syntax(query: str) -> None:
    base = local_base("hostile")
    put(base, "leave.md", LEAVE)
    outcome = knowledge_search(employee="", query=query[:2000], bases=["hostile"], top_k=3)
    assert all(hit.document == "leave.md" for hit in outcome.hits)
    if "leave" in query.lower():
        assert outcome.hits


def test_the_match_expression_quotes_every_term() -> None:
    assert (
        fts5_match('say "hello world" NEAR(x) a"b')
        == '"say" OR "hello world" OR "near" OR "x" OR "b"'
    )
    assert terms("the and of") == ["the", "and", "of"]  # only stopwords: searched anyway
    assert terms("the leave") == ["leave"]
    assert fts5_match("!!! ***") == ""


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the tsvector column is PostgreSQL's")
def test_postgresql_has_a_generated_tsvector_with_a_gin_index() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'knowledge_knowledgechunk' "
            "AND indexname = 'knowledge_chunk_tsv'"
        )
        assert "gin (search_tsv)" in cursor.fetchone()[0].lower()
        cursor.execute("SELECT websearch_to_tsquery('english', %s)::text", ['"a b" -c or'])
        cursor.fetchone()
    base = local_base("pg")
    put(base, "leave.md", LEAVE)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT search_tsv::text FROM knowledge_knowledgechunk WHERE base_id = %s", [base.pk]
        )
        assert "'leav'" in cursor.fetchone()[0]


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the FTS5 table is SQLite's")
def test_sqlite_keeps_the_fts5_table_in_sync_by_triggers() -> None:
    base = local_base("lite")
    put(base, "leave.md", LEAVE)
    chunk = KnowledgeChunk.objects.get(base=base)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT rowid FROM knowledge_chunk_fts WHERE knowledge_chunk_fts MATCH 'leave'"
        )
        assert [row[0] for row in cursor.fetchall()] == [chunk.pk]
    KnowledgeChunk.objects.filter(pk=chunk.pk).update(text="nothing about holidays")
    assert ranked_chunks([base.pk], "leave", 5) == []
    assert [pk for pk, _ in ranked_chunks([base.pk], "holidays", 5)] == [chunk.pk]
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO knowledge_chunk_fts(knowledge_chunk_fts) VALUES ('integrity-check')"
        )
