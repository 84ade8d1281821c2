"""Full text beside the chunk table, per vendor: PostgreSQL a generated ``tsvector`` column
(stored in the row) with a GIN index; SQLite an FTS5 table over the chunks' text, kept in sync by triggers."""

from __future__ import annotations

from typing import Any

from django.db import migrations

POSTGRES_UP = [
    "ALTER TABLE knowledge_knowledgechunk ADD COLUMN search_tsv tsvector "
    "GENERATED ALWAYS AS (to_tsvector('english', text)) STORED",
    # Kept in the row (compressed) rather than out of line: ranking reads every match's vector.
    "ALTER TABLE knowledge_knowledgechunk ALTER COLUMN search_tsv SET STORAGE MAIN",
    "CREATE INDEX knowledge_chunk_tsv ON knowledge_knowledgechunk USING GIN (search_tsv)",
]
POSTGRES_DOWN = [
    "DROP INDEX IF EXISTS knowledge_chunk_tsv",
    "ALTER TABLE knowledge_knowledgechunk DROP COLUMN IF EXISTS search_tsv",
]
SQLITE_UP = [
    "CREATE VIRTUAL TABLE knowledge_chunk_fts USING fts5(text, "
    "content='knowledge_knowledgechunk', content_rowid='id', "
    "tokenize='porter unicode61 remove_diacritics 2')",
    "CREATE TRIGGER knowledge_chunk_fts_insert AFTER INSERT ON knowledge_knowledgechunk BEGIN "
    "INSERT INTO knowledge_chunk_fts(rowid, text) VALUES (new.id, new.text); END",
    "CREATE TRIGGER knowledge_chunk_fts_delete AFTER DELETE ON knowledge_knowledgechunk BEGIN "
    "INSERT INTO knowledge_chunk_fts(knowledge_chunk_fts, rowid, text) "
    "VALUES ('delete', old.id, old.text); END",
    "CREATE TRIGGER knowledge_chunk_fts_update AFTER UPDATE OF text ON knowledge_knowledgechunk "
    "BEGIN INSERT INTO knowledge_chunk_fts(knowledge_chunk_fts, rowid, text) "
    "VALUES ('delete', old.id, old.text); "
    "INSERT INTO knowledge_chunk_fts(rowid, text) VALUES (new.id, new.text); END",
    "INSERT INTO knowledge_chunk_fts(knowledge_chunk_fts) VALUES ('rebuild')",
]
SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS knowledge_chunk_fts_insert",
    "DROP TRIGGER IF EXISTS knowledge_chunk_fts_delete",
    "DROP TRIGGER IF EXISTS knowledge_chunk_fts_update",
    "DROP TABLE IF EXISTS knowledge_chunk_fts",
]


def _run(statements: dict[str, list[str]]) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        for sql in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("knowledge", "0001_initial")]

    operations = [
        migrations.RunPython(
            _run({"postgresql": POSTGRES_UP, "sqlite": SQLITE_UP}),
            _run({"postgresql": POSTGRES_DOWN, "sqlite": SQLITE_DOWN}),
        )
    ]
