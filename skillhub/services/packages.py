"""A skill's declared ``packages``: the specs installed into its package environment.

Python: a PyPI distribution name (PEP 508 name characters: ``PyYAML``, ``typing-extensions``),
optionally pinned ``name==X.Y`` or ``name==X.Y.Z``. Node.js: an npm package name, optionally
scoped (``@scope/name``), optionally pinned ``name@X.Y.Z``. No ranges, URLs, paths, extras or
shell syntax, so nothing an installer could be tricked with is ever stored; each spec is passed
to pip/npm after ``--`` as one argument besides. One name at most once. The environment itself:
``skillhub.services.envbuild`` (on disk) and ``skillhub.services.environments`` (its record).
"""

from __future__ import annotations

import re
from typing import Any

_PEP508_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?"
#: Python: a distribution name, optionally ``==X.Y[.Z]``.
PYTHON_PACKAGE = re.compile(rf"^(?P<name>{_PEP508_NAME})(?:==\d{{1,9}}(?:\.\d{{1,9}}){{1,2}})?$")
_NPM_NAME = r"(?:@[A-Za-z0-9][A-Za-z0-9._~-]{0,99}/)?[A-Za-z0-9][A-Za-z0-9._~-]{0,99}"
_SEMVER = r"\d{1,9}\.\d{1,9}\.\d{1,9}(?:-[0-9A-Za-z.-]{1,50})?"
#: Node.js: an npm package name, optionally scoped, optionally ``@X.Y.Z``.
NODE_PACKAGE = re.compile(rf"^(?P<name>{_NPM_NAME})(?:@{_SEMVER})?$")


def package_pattern(language: Any) -> re.Pattern[str]:
    return NODE_PACKAGE if language == "node" else PYTHON_PACKAGE


def package_hint(language: Any) -> str:
    if language == "node":
        return (
            "an npm package name such as lodash or @scope/name, optionally pinned as "
            "name@1.2.3 (no ranges, path or spaces)"
        )
    return (
        "a PyPI distribution name such as numpy or PyYAML, optionally pinned as name==1.2 or "
        "name==1.2.3 (no ranges, extras, URL, path or spaces)"
    )


def package_name(spec: str, language: Any) -> str:
    """The package a spec names, normalised (Python: PEP 503; npm: lower case)."""
    match = package_pattern(language).fullmatch(spec)
    name = match.group("name") if match else spec
    return name.lower() if language == "node" else re.sub(r"[-_.]+", "-", name).lower()


def package_errors(values: list[str], language: Any) -> list[tuple[int, str]]:
    """(index, detail) of each invalid or repeated spec."""
    pattern, hint = package_pattern(language), package_hint(language)
    errors: list[tuple[int, str]] = []
    seen: dict[str, int] = {}
    for i, value in enumerate(values):
        if not pattern.fullmatch(value):
            errors.append((i, f"{value!r} is not a valid package: expected {hint}"))
            continue
        name = package_name(value, language)
        if name in seen:
            errors.append((i, f"{value!r} names the same package as /packages/{seen[name]}"))
        seen.setdefault(name, i)
    return errors
