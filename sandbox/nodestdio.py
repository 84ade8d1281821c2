"""Blocking stdout and stderr for Node.js programs, so an output flood meets the output cap.

Node.js makes the pipes of its stdout and stderr non-blocking: a program that writes in a loop
never waits for the reader, the writes it cannot hand to the pipe queue up in its own memory,
and it dies of that (``std::bad_alloc``, a heap limit, or ``ENOBUFS``) after a few hundred KiB
reached the pipe, so the runner never saw the cap passed and reported neither a truncation nor
a kill reason. A preload module passed with ``--import`` makes both streams blocking before the
program starts, as they are for Python: a flood then fills the pipe, the runner reads up to the
cap, kills the run and reports ``output_cap`` with the stream truncated.

``--import`` needs Node.js 18.18 or later; for an older interpreter (found once per
path with ``node --version``) the preload is left out and such floods keep the old behaviour.
"""

from __future__ import annotations

import functools
import re
import subprocess
from urllib.parse import quote

_PRELOAD = (
    "for (const stream of [process.stdout, process.stderr]) {"
    " const handle = stream._handle;"
    " if (handle && typeof handle.setBlocking === 'function') handle.setBlocking(true); }"
)
#: The preload as a data: URL (percent-encoded: a raw "?" or "#" would end the module text).
PRELOAD_URL = "data:text/javascript," + quote(_PRELOAD, safe="")
_VERSION = re.compile(r"v?(\d+)\.(\d+)")


def node_stdio_args(node_path: str) -> list[str]:
    """The interpreter options that make a Node.js program's stdout and stderr blocking
    (``[]`` for an interpreter without ``--import``)."""
    return ["--import", PRELOAD_URL] if _supports_import(node_path) else []


@functools.cache
def _supports_import(node_path: str) -> bool:
    try:
        found = subprocess.run(
            [node_path, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return False
    match = _VERSION.match(found.stdout.strip())
    if match is None:
        return False
    return (int(match.group(1)), int(match.group(2))) >= (18, 18)
