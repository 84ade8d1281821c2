"""Full-text search over chunks, per database vendor, with user text that can never break the
query syntax: the query is cut into words and quoted phrases here, and each is passed as a
parameter (PostgreSQL: ``websearch_to_tsquery`` per term, OR-ed; SQLite: FTS5 strings).

PostgreSQL ranks with ``ts_rank_cd`` over the generated ``search_tsv`` column (English
stemming, GIN index); SQLite with ``bm25()`` over the ``knowledge_chunk_fts`` FTS5 table
(Porter stemming). Terms are OR-ed: a chunk with more of them (closer together) ranks higher.
"""

from __future__ import annotations

import re

from orchestrator.sql import fetch_all, is_postgres, placeholders

#: Most terms of one query that reach the database.
MAX_TERMS = 16
MAX_TERM_CHARS = 100
_TERM = re.compile(r'"([^"]*)"|(\w+)', re.UNICODE)
_WORD = re.compile(r"\w+", re.UNICODE)
#: English words too common to search for (PostgreSQL's 'english' configuration drops these
#: and more; SQLite needs it said).
STOPWORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "can", "do", "does", "for", "from",
    "has", "have", "how", "i", "if", "in", "into", "is", "it", "its", "me", "my", "not", "of",
    "on", "or", "our", "so", "that", "the", "their", "them", "then", "there", "these", "they",
    "this", "to", "was", "we", "were", "what", "when", "where", "which", "who", "why", "will",
    "with", "you", "your",
})  # fmt: skip


def terms(query: str) -> list[str]:
    """The words and quoted phrases of ``query`` worth searching (stopwords dropped unless
    nothing else is left), at most ``MAX_TERMS``; phrases come back as space-joined words."""
    found: list[str] = []
    for phrase, word in _TERM.findall(query):
        if phrase:
            words = _WORD.findall(phrase)
            if words:
                found.append(" ".join(w[:MAX_TERM_CHARS] for w in words[:MAX_TERMS]))
        elif word:
            found.append(word[:MAX_TERM_CHARS])
    lowered = list(dict.fromkeys(term.lower() for term in found))
    kept = [term for term in lowered if term not in STOPWORDS]
    return (kept or lowered)[:MAX_TERMS]


def fts5_match(query: str) -> str:
    """An FTS5 MATCH expression for ``query``: each term a string (``"..."``, any ``"``
    doubled), OR-ed; "" when there is nothing to search."""
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms(query))


def ranked_chunks(base_ids: list[int], query: str, limit: int) -> list[tuple[int, float]]:
    """``(chunk id, score)`` of the best ``limit`` chunks of ``base_ids`` for ``query``,
    best first (higher is better)."""
    found = terms(query)
    if not base_ids or not found:
        return []
    if is_postgres():
        tsquery = " || ".join(["websearch_to_tsquery('english', %s)"] * len(found))
        sql = (
            f"SELECT c.id, ts_rank_cd(c.search_tsv, q.query) AS rank "  # noqa: S608 (placeholders)
            f"FROM knowledge_knowledgechunk c, (SELECT {tsquery} AS query) q "
            f"WHERE c.search_tsv @@ q.query AND c.base_id IN ({placeholders(base_ids)}) "
            f"ORDER BY rank DESC, c.id LIMIT %s"
        )
        params = [_pg_term(term) for term in found]
    else:
        sql = (
            "SELECT c.id, -bm25(knowledge_chunk_fts) AS rank FROM knowledge_chunk_fts "  # noqa: S608
            "JOIN knowledge_knowledgechunk c ON c.id = knowledge_chunk_fts.rowid "
            f"WHERE knowledge_chunk_fts MATCH %s AND c.base_id IN ({placeholders(base_ids)}) "
            "ORDER BY bm25(knowledge_chunk_fts), c.id LIMIT %s"
        )
        params = [fts5_match(query)]
    rows = fetch_all(sql, [*params, *base_ids, limit])
    return [(int(chunk_id), float(rank)) for chunk_id, rank in rows]


def _pg_term(term: str) -> str:
    # websearch_to_tsquery reads a quoted text as a phrase and never raises on syntax.
    return f'"{term}"' if " " in term else term
