"""A skill's declared ``packages``: validated on save, checked in the sandbox before each run.

Nothing is installed: the sandbox has no network by default and runs ``python3 -I -S`` /
``node`` as is. Before the program runs, a short preflight program runs in the same sandbox
(same interpreter, flags, working-directory files and code location) and reports which
declared packages it cannot find: Python with ``importlib.util.find_spec`` of the import name,
Node.js with ``require.resolve``. A missing package fails the execution with a message naming
it, instead of an ImportError in the middle of the program. docs/skills.md tells operators how
to provide packages.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from sandbox import SandboxError, SandboxRequest, run_sandboxed

#: Python: an import name (dotted identifiers); a ``-`` in the first part is read as ``_``, so
#: distribution names such as ``typing-extensions`` work. No versions, paths or shell syntax.
PYTHON_PACKAGE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,99}(\.[A-Za-z_][A-Za-z0-9_]{0,99}){0,9}$")
#: Node.js: an npm package name, optionally scoped (``@scope/name``); no versions or paths.
NODE_PACKAGE = re.compile(
    r"^(@[A-Za-z0-9][A-Za-z0-9._~-]{0,99}/)?[A-Za-z0-9][A-Za-z0-9._~-]{0,99}$"
)
#: How long the preflight may take (it is a few imports' worth of lookups).
PREFLIGHT_TIMEOUT_SECONDS = 10.0

_PYTHON_CHECK = """\
import importlib.util, json, sys
missing = []
for name in json.loads(sys.stdin.read()):
    module = name.split(".", 1)
    module[0] = module[0].replace("-", "_")
    try:
        found = importlib.util.find_spec(".".join(module)) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        missing.append(name)
print(json.dumps(missing))
"""

_NODE_CHECK = """\
const names = JSON.parse(require("fs").readFileSync(0, "utf8"));
const missing = [];
for (const name of names) {
  try { require.resolve(name); } catch (err) { missing.push(name); }
}
console.log(JSON.stringify(missing));
"""


def package_pattern(language: Any) -> re.Pattern[str]:
    return NODE_PACKAGE if language == "node" else PYTHON_PACKAGE


def package_hint(language: Any) -> str:
    if language == "node":
        return "an npm package name such as lodash or @scope/name (no version, path or spaces)"
    return (
        "a Python import name such as numpy or yaml (dotted names allowed; no version, path or "
        "spaces)"
    )


def packages_missing(request: SandboxRequest, packages: list[str]) -> list[str]:
    """Which of ``packages`` the interpreter of ``request`` cannot find, asked in the sandbox.

    Raises SandboxError when the check itself cannot run or gives no answer."""
    check = replace(
        request,
        code=_NODE_CHECK if request.language == "node" else _PYTHON_CHECK,
        stdin=json.dumps(packages),
        timeout_seconds=min(PREFLIGHT_TIMEOUT_SECONDS, request.timeout_seconds),
        network="deny",
        collect_outputs=None,
        output_cap_bytes=1024 * 1024,
    )
    result = run_sandboxed(check)
    try:
        missing = json.loads(result.stdout) if result.exit_code == 0 else None
    except ValueError:
        missing = None
    if not isinstance(missing, list):
        raise SandboxError(
            f"the package check could not run (exit {result.exit_code}, "
            f"killed: {result.killed_reason}): {result.stderr[-500:]}"
        )
    return [str(name) for name in missing]


def packages_missing_text(missing: list[str], language: str) -> str:
    """The execution's error for missing packages, naming each one."""
    names = ", ".join(f"'{name}'" for name in missing)
    if len(missing) == 1:
        head, it = f"package {names} is not installed on this skills worker", "it"
    else:
        head, it = f"packages {names} are not installed on this skills worker", "them"
    return (
        f"{head}; install {it} on the worker image or remove {it} from packages "
        f"(the {language} interpreter of the sandbox cannot find {it}; see docs/skills.md)"
    )
