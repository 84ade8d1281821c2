"""Where an instruction is used: a registry of finders the apps that hold prompts fill.

``instructions`` sits below ``orchestrator.agents`` and ``loops`` and must not import them, so
each of those apps registers a finder here in its ``AppConfig.ready``. A finder takes an
instruction's name and returns one :class:`InstructionUsage` per place and pinned version that
references it (``${instructions.NAME}`` or ``${instructions.NAME@N}``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from runtime.prompt_template import instruction_references


@dataclass(frozen=True)
class InstructionUsage:
    """One reference to an instruction: what holds it (``kind`` and ``label``, e.g. employee
    ``ada``), in which ``field``, where its resource is (``url``) and the version it pins
    (None: the latest published)."""

    kind: str
    label: str
    field: str
    url: str
    pinned_version: int | None


UsageFinder = Callable[[str], list[InstructionUsage]]

_FINDERS: list[UsageFinder] = []


def register(finder: UsageFinder) -> None:
    """Ask ``finder`` on every where-used question (idempotent: registering it again changes
    nothing)."""
    if finder not in _FINDERS:
        _FINDERS.append(finder)


def finders() -> tuple[UsageFinder, ...]:
    return tuple(_FINDERS)


def instruction_usages(name: str) -> list[InstructionUsage]:
    """Every use of ``name`` the registered finders report, sorted by kind, label and field."""
    found = [usage for finder in finders() for usage in finder(name)]
    return sorted(found, key=lambda u: (u.kind, u.label, u.field, u.pinned_version or 0))


def usages_in(
    text: str, name: str, *, kind: str, label: str, field: str, url: str
) -> list[InstructionUsage]:
    """The uses of ``name`` in one field's ``text``: one per distinct pinned version (None
    first), decided by the reference grammar (``runtime.prompt_template``), not by substring."""
    return [InstructionUsage(kind, label, field, url, v) for v in references_to(text, name)]


def references_to(text: str, name: str) -> list[int | None]:
    """The distinct versions (None: unversioned) with which ``text`` references ``name``."""
    pinned = {version for ref, version in instruction_references(text) if ref == name}
    return sorted(pinned, key=lambda v: -1 if v is None else v)
