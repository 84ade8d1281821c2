"""The pure half of budgets stays pure: no database access and no Django import in it."""

from __future__ import annotations

import ast
from pathlib import Path

from loops.services import budget_rules

_IMPURE = ("django", "loops.models", "loops.db", "orchestrator.sql", "psycopg")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_budget_rules_imports_no_database_and_no_django() -> None:
    imported = _imports(Path(budget_rules.__file__))
    assert not {m for m in imported if m.startswith(_IMPURE)}
