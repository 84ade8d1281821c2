"""Read-only queries of the knowledge pages: the bases with their counts, a base's documents,
and the Knowledge Access matrix (every employee x every base)."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce

from knowledge.models import KnowledgeAccess, KnowledgeBase, KnowledgeChunk, KnowledgeDocument
from orchestrator.agents.models import Employee
from orchestrator.errors import NotFound

#: How a matrix cell's checkbox names its pair: ``<employee>|<base key>``.
CELL_SEPARATOR = "|"


def _count(rows: QuerySet[KnowledgeDocument] | QuerySet[KnowledgeChunk], by: str) -> Coalesce:
    counted = rows.order_by().values(by).annotate(n=Count("pk")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


def knowledge_bases_overview() -> list[KnowledgeBase]:
    """Every base by name, with ``document_count`` and ``chunk_count``."""
    documents = KnowledgeDocument.objects.filter(base=OuterRef("pk"))
    chunks = KnowledgeChunk.objects.filter(document__base=OuterRef("pk"))
    return list(
        KnowledgeBase.objects.annotate(
            document_count=_count(documents, "base"), chunk_count=_count(chunks, "document__base")
        ).order_by("name", "key")
    )


def knowledge_base_get(key: str) -> KnowledgeBase:
    """The base ``key``; :class:`NotFound` (a 404 page) when there is none."""
    base = KnowledgeBase.objects.filter(key=key).first()
    if base is None:
        raise NotFound(f"There is no knowledge base {key!r}.")
    return base


def base_documents(base: KnowledgeBase) -> list[KnowledgeDocument]:
    """The base's documents, newest first, with ``chunk_count``."""
    chunks = KnowledgeChunk.objects.filter(document=OuterRef("pk"))
    return list(
        KnowledgeDocument.objects.filter(base=base)
        .annotate(chunk_count=_count(chunks, "document"))
        .order_by("-created_at", "-pk")
    )


@dataclass(frozen=True)
class MatrixCell:
    base: str
    granted: bool

    employee: str = ""

    @property
    def value(self) -> str:
        return f"{self.employee}{CELL_SEPARATOR}{self.base}"


@dataclass
class MatrixRow:
    employee: str
    cells: list[MatrixCell] = field(default_factory=list)


@dataclass(frozen=True)
class AccessMatrix:
    """Employees x bases; ``granted`` holds the ``(employee, base key)`` pairs that may read."""

    employees: list[str]
    bases: list[KnowledgeBase]
    granted: frozenset[tuple[str, str]]

    @property
    def rows(self) -> list[MatrixRow]:
        return [
            MatrixRow(e, [MatrixCell(b.key, (e, b.key) in self.granted, e) for b in self.bases])
            for e in self.employees
        ]

    def pairs(self, values: set[str]) -> frozenset[tuple[str, str]]:
        """The pairs the checked ``values`` name, among the matrix's employees and bases."""
        keys = {b.key for b in self.bases}
        found = set()
        for value in values:
            employee, _, base = value.partition(CELL_SEPARATOR)
            if employee in self.employees and base in keys:
                found.add((employee, base))
        return frozenset(found)


def access_matrix() -> AccessMatrix:
    """Every AI employee x every base, and who may read what."""
    employees = list(Employee.objects.order_by("username").values_list("username", flat=True))
    bases = list(KnowledgeBase.objects.order_by("name", "key"))
    granted = frozenset(KnowledgeAccess.objects.values_list("employee", "base__key"))
    return AccessMatrix(employees, bases, granted)
