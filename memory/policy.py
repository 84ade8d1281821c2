"""The harness ``memory`` section of a role, as agent memory reads it (docs/harness.md). Pure.

A missing section or field reads as off (a snapshot compiled before memory existed has no
``write`` and no ``maxItems``): memory is never on by accident.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MemoryPolicy:
    """``memory.enabled``, ``memory.write``, ``memory.scopes``, ``memory.maxItems`` and
    ``memory.maxChars`` of one role's compiled settings."""

    enabled: bool = False
    write: bool = False
    scopes: frozenset[str] = frozenset()
    max_items: int = 0
    max_chars: int = 0

    @classmethod
    def of(cls, settings: Mapping[str, Any] | None) -> MemoryPolicy:
        """From compiled harness settings (``None``: no snapshot, everything off)."""
        section = (settings or {}).get("memory")
        if not isinstance(section, Mapping):
            return cls()
        scopes = section.get("scopes")
        return cls(
            enabled=section.get("enabled") is True,
            write=section.get("write") is True,
            scopes=frozenset(s for s in scopes if isinstance(s, str))
            if isinstance(scopes, list)
            else frozenset(),
            max_items=_count(section.get("maxItems")),
            max_chars=_count(section.get("maxChars")),
        )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
