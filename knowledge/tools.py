"""Knowledge bases as agent tools: ``knowledge_search`` and ``external_rag_search``
(docs/knowledge.md).

:class:`KnowledgeToolProvider` is a :class:`~runtime.tools.registry.ToolProvider` registered by
the app. Its two tools are read tools with fixed names, so the harness plans them like any other
tool (``tools.allow``, ``tools.effects`` may raise their tier) and they are offered only to an
employee that binds them (its ``tools`` list).

A call authorises from the invocation its context carries (``ToolContext.invocation``: the
employee, the person the work is for, the run and the role's invocation; a call without one is
refused), runs :func:`knowledge.search.knowledge_search` on a database thread (the ORM may not
run in the event loop), which checks the knowledge access matrix and records one ``Retrieval``
row, and answers with numbered results, each with its source (base, document, score) so the
model can cite them. A refusal of the access matrix is a tool error naming it; no hit is an
answer that says so. ``external_rag_search`` is the same lookup over the ``external_rag`` bases
only: named bases of another kind are refused, and without ``bases`` it searches the external
bases the employee may read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from knowledge.models import KnowledgeAccess, KnowledgeBase
from knowledge.search import Hit, KnowledgeRefused, SearchOutcome, knowledge_search
from orchestrator.dbthreads import OffLoopDb
from runtime.reach import network_refusal
from runtime.tools.base import Invocation, Tool, ToolContext, ToolError, ToolResult
from runtime.tools.bash import call_network
from runtime.types import Effect, ToolSpec

KNOWLEDGE_SEARCH = "knowledge_search"
EXTERNAL_RAG_SEARCH = "external_rag_search"
TOOL_NAMES = (KNOWLEDGE_SEARCH, EXTERNAL_RAG_SEARCH)
EXTERNAL_KIND = "external_rag"
DEFAULT_TOP_K = 5
MAX_TOP_K = 20
MAX_QUERY_CHARS = 2000
MAX_BASES = 50
#: The invocation name of a request-scoped chat (``runtime.chat``): its ``run_id`` is no run.
CHAT_INVOCATION = "chat"
_THREADS = OffLoopDb("knowledge-tools")


def _parameters(what: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_QUERY_CHARS,
                "description": "What to look for, in plain words.",
            },
            "bases": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": 100},
                "maxItems": MAX_BASES,
                "uniqueItems": True,
                "description": f"Keys of the {what} to search; leave out to search all of "
                "them that you may read.",
            },
            "top_k": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_TOP_K,
                "default": DEFAULT_TOP_K,
                "description": f"How many results to return (1-{MAX_TOP_K}, default "
                f"{DEFAULT_TOP_K}).",
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    }


SPECS: dict[str, ToolSpec] = {
    KNOWLEDGE_SEARCH: ToolSpec(
        name=KNOWLEDGE_SEARCH,
        description="Search the knowledge bases you may read (documents the team uploaded, "
        "and external RAG services) and get the best matching passages, numbered, each with "
        "its source (base, document, score). Cite the passages you use by number and source.",
        parameters=_parameters("knowledge bases"),
        effect=Effect.READ,
    ),
    EXTERNAL_RAG_SEARCH: ToolSpec(
        name=EXTERNAL_RAG_SEARCH,
        description="Search only the external RAG knowledge bases you may read and get the "
        "best matching passages, numbered, each with its source (base, document, score). Cite "
        "the passages you use by number and source.",
        parameters=_parameters("external RAG bases"),
        effect=Effect.READ,
    ),
}


class KnowledgeToolProvider:
    """The knowledge tools of the production registry (always the same two)."""

    def get(self, name: str) -> Tool | None:
        spec = SPECS.get(name)
        return None if spec is None else KnowledgeSearchTool(spec)

    def specs(self) -> list[ToolSpec]:
        return list(SPECS.values())

    def review_gates(self, names: Iterable[str]) -> dict[str, tuple[str, str]]:
        return {}  # the harness plan decides; a search imposes no review of its own


KNOWLEDGE_TOOLS = KnowledgeToolProvider()


class KnowledgeSearchTool:
    """One of the two searches; ``external_rag_search`` keeps to the external bases."""

    def __init__(self, spec: ToolSpec) -> None:
        self._spec = spec

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    @property
    def external_only(self) -> bool:
        return self._spec.name == EXTERNAL_RAG_SEARCH

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        invocation = context.invocation
        if invocation is None:
            raise ToolError(
                f"{self._spec.name} runs only inside a run or a chat, for an AI employee; "
                "this call has none."
            )
        query = str(arguments["query"]).strip()
        if not query:
            raise ToolError("The query is empty: say what to look for.")
        named = arguments.get("bases")
        bases = [str(b) for b in named] if named else None
        top_k = int(arguments.get("top_k") or DEFAULT_TOP_K)
        network, hosts = call_network(context)
        reach = functools.partial(_unreachable, network=network, hosts=hosts)
        search = functools.partial(self._search, invocation, query, bases, top_k, reach)
        try:
            outcome = await _THREADS.run(search)
        except KnowledgeRefused as exc:
            raise ToolError(f"Refused: {exc.message}") from exc
        return ToolResult(answer_text(query, outcome))

    def _search(
        self,
        invocation: Invocation,
        query: str,
        bases: list[str] | None,
        top_k: int,
        reach: Callable[[str], str],
    ) -> SearchOutcome:
        """The search, on a database thread; recorded as one ``Retrieval`` of the caller."""
        if self.external_only:
            bases = external_bases(invocation.employee, bases)
        chat = invocation.name == CHAT_INVOCATION
        return knowledge_search(
            employee=invocation.employee,
            query=query,
            bases=bases,
            top_k=top_k,
            user=invocation.user,
            run_id=None if chat else invocation.run_id,
            invocation=invocation.name,
            chat=chat,
            tool=self._spec.name,
            reach=reach,
        )


def _unreachable(url: str, *, network: str, hosts: Sequence[str]) -> str:
    """Why the calling role's network may not reach ``url`` ("" when it may)."""
    return network_refusal([url], network, hosts)


def external_bases(employee: str, named: list[str] | None) -> list[str]:
    """The bases an ``external_rag_search`` searches: the ``named`` ones, which must all be
    external RAG bases, or else every external base ``employee`` may read (every external
    base when it may read none, so that the search refuses naming the access matrix)."""
    kinds = dict(KnowledgeBase.objects.values_list("key", "kind"))
    if named is not None:
        local = [key for key in named if key in kinds and kinds[key] != EXTERNAL_KIND]
        if local:
            raise ToolError(
                f"{EXTERNAL_RAG_SEARCH} searches external RAG bases only; "
                f"{', '.join(sorted(local))} {'is' if len(local) == 1 else 'are'} not one: "
                f"use {KNOWLEDGE_SEARCH} for {'it' if len(local) == 1 else 'them'}."
            )
        return named
    external = sorted(key for key, kind in kinds.items() if kind == EXTERNAL_KIND)
    if not external:
        raise ToolError(f"There is no external RAG base to search; use {KNOWLEDGE_SEARCH}.")
    readable = set(
        KnowledgeAccess.objects.filter(employee=employee, base__key__in=external).values_list(
            "base__key", flat=True
        )
    )
    return [key for key in external if key in readable] or external


def answer_text(query: str, outcome: SearchOutcome) -> str:
    """What the model reads: numbered hits, each with its source, or that there were none."""
    searched = ", ".join(outcome.bases) or "none"
    if not outcome.hits:
        return f'No results for "{query}" in the knowledge bases searched ({searched}).'
    lines = [
        f'{len(outcome.hits)} results for "{query}" from the knowledge bases searched '
        f"({searched}). Cite a result by its number and source, e.g. [1] "
        f"{citation(outcome.hits[0])}.",
    ]
    for number, hit in enumerate(outcome.hits, start=1):
        lines.append("")
        lines.append(f"[{number}] {citation(hit)} (score {hit.score:.3f})")
        lines.append(hit.text.strip())
    return "\n".join(lines)


def citation(hit: Hit) -> str:
    """``base / document``, with where the document came from when the hit says so."""
    where = _origin(hit.source)
    return f"{hit.base} / {hit.document}" + (f" <{where}>" if where else "")


def _origin(source: dict[str, Any]) -> str:
    for key in ("url", "source", "uri"):
        value = source.get(key) if isinstance(source, dict) else None
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""
