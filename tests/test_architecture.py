"""The shape of the tree (docs/architecture.md): no import cycle, no oversized file, one name per
class, and a runtime and sandbox that import nothing of Django.

`make lint` checks the layers with import-linter; these tests keep the rest of the picture.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import Counter
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "orchestrator",
    "frontend",
    "loops",
    "skillhub",
    "gateway",
    "harness",
    "runtime",
    "sandbox",
)
MAX_LINES = 600
#: Django's own conventions: every management command is a ``Command``, every migration a
#: ``Migration``.
CONVENTIONAL_NAMES = {"Command", "Migration"}


def _product_files() -> list[Path]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    files += (ROOT / "tests").rglob("*.py")
    return sorted(p for p in files if "migrations" not in p.parts)


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start) & modules)))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                imported = graph.find_modules_directly_imported_by(child) & modules
                work.append((child, iter(sorted(imported))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_module_imports_itself_through_others() -> None:
    """Imports inside functions count: a cycle dodged at import time is still a cycle."""
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    modules = {m for m in graph.modules if ".migrations" not in m}
    assert _cycles(graph, modules) == []


def test_no_file_is_over_600_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _product_files()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_no_two_classes_share_a_name() -> None:
    names: Counter[str] = Counter()
    for path in _product_files():
        if path.parts[len(ROOT.parts)] == "tests":
            continue
        tree = ast.parse(path.read_text())
        names.update(n.name for n in tree.body if isinstance(n, ast.ClassDef))
    shared = {name: count for name, count in names.items() if count > 1}
    assert {n: c for n, c in shared.items() if n not in CONVENTIONAL_NAMES} == {}


@pytest.mark.parametrize("package", ["runtime", "sandbox"])
def test_runtime_and_sandbox_load_without_django(package: str) -> None:
    """Every module of the package imports in a fresh interpreter without loading Django, DRF,
    Celery or any product app."""
    probe = (
        "import importlib, pkgutil, sys\n"
        f"import {package} as pkg\n"
        "for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "    importlib.import_module(m.name)\n"
        "banned = ('django', 'rest_framework', 'celery', 'orchestrator', 'loops', 'skillhub',\n"
        "          'harness', 'frontend')\n"
        "print(sorted({n.split('.')[0] for n in sys.modules} & set(banned)))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
