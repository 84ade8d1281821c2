"""Colour for ``loopwright`` on a terminal: status words, roles and errors.

Colour is on when the stream is a terminal, off when it is piped or a file; ``NO_COLOR``
(https://no-color.org) turns it off and ``FORCE_COLOR`` on (``NO_COLOR`` wins when both are
set), and the flags ``--color=always|never`` and ``--no-color`` win over both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TextIO

RESET = "\x1b[0m"
BOLD, RED, GREEN, YELLOW, BLUE, MAGENTA, CYAN = "1", "31", "32", "33", "34", "35", "36"

#: The words of run, step and approval statuses, by what they mean to the reader.
_STATUS = {
    **dict.fromkeys(("succeeded", "completed", "approved", "answered", "accepted"), GREEN),
    **dict.fromkeys(("failed", "rejected", "error", "expired", "timed_out"), RED),
    **dict.fromkeys(("canceled", "skipped", "superseded"), MAGENTA),
    **dict.fromkeys(
        ("waiting_approval", "waiting_human", "paused", "blocked", "gated", "pending"), YELLOW
    ),
}
_ROLE = {"leader": MAGENTA, "maker": BLUE, "verifier": CYAN}
_FORCE_OFF = {"", "0", "false", "no"}


def colour_wanted(choice: str, stream: TextIO, environ: Mapping[str, str]) -> bool:
    """``choice`` is ``always``, ``never`` or ``auto`` (the environment, then the terminal)."""
    if choice in ("always", "never"):
        return choice == "always"
    if environ.get("NO_COLOR"):
        return False
    if environ.get("FORCE_COLOR", "").strip().lower() not in _FORCE_OFF:
        return True
    if environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@dataclass(frozen=True)
class Palette:
    """Paints words for one stream; a disabled palette returns them unchanged."""

    enabled: bool = False

    def paint(self, text: str, *codes: str) -> str:
        if not self.enabled or not text or not codes:
            return text
        return f"\x1b[{';'.join(codes)}m{text}{RESET}"

    def status(self, word: str, shown: str | None = None) -> str:
        """``shown`` (default ``word``) in the colour of the status ``word``; any other in bold."""
        code = _STATUS.get(word.lower())
        return self.paint(shown or word, *(code,) if code else (BOLD,))

    def role(self, word: str) -> str:
        return self.paint(word, _ROLE.get(word, CYAN))

    def error(self, text: str) -> str:
        return self.paint(text, RED)

    def link(self, url: str) -> str:
        return self.paint(url, "4")


PLAIN = Palette(enabled=False)
