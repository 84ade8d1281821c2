"""The built-in detectors of the guardrails (:mod:`runtime.guardrails`): block lists, regular
expressions and their safety check, PII (emails, phone numbers, card numbers with Luhn, IBANs
with mod 97) and secret shapes (API keys, private key blocks, Loopwright tokens).

Every detector returns the first :class:`Finding` or None; a finding says what matched with the
matched text masked (:func:`mask`), so a reason never carries a secret or a card number in full.
Pure: no I/O.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

PiiType = Literal["email", "phone", "credit_card", "iban"]
SecretType = Literal["openai", "aws", "github", "slack", "private_key", "loopwright"]
PII_TYPES: tuple[PiiType, ...] = ("email", "phone", "credit_card", "iban")
SECRET_TYPES: tuple[SecretType, ...] = (
    "openai", "aws", "github", "slack", "private_key", "loopwright"
)  # fmt: skip

#: Explicit repeat counts above this are refused in a rule's regex (``a{100000}``).
MAX_REPEAT_COUNT = 1000

# re's own parser (stable across 3.11+, private by name): the regex safety check walks its tree.
_parser: Any = importlib.import_module("re._parser")
_constants: Any = importlib.import_module("re._constants")


@dataclass(frozen=True)
class Finding:
    """What a detector matched: ``label`` (what kind of thing) and ``shown`` (masked text)."""

    label: str
    shown: str

    def describe(self) -> str:
        return f"{self.label} ({self.shown})" if self.shown else self.label


def mask(value: str) -> str:
    """``value`` with at most its first quarter (4 characters at most) kept and the length."""
    keep = min(4, len(value) // 4)
    return f"{value[:keep]}*** ({len(value)} chars)"


# --- block lists and regular expressions ------------------------------------------------------


@functools.lru_cache(maxsize=256)
def blocklist_regex(words: tuple[str, ...]) -> re.Pattern[str]:
    """One case-insensitive pattern for ``words``: each word or phrase on word boundaries, any
    run of whitespace inside a phrase matching any other."""
    parts = sorted({r"\s+".join(re.escape(w) for w in word.split()) for word in words}, key=len)
    return re.compile(r"(?<!\w)(?:" + "|".join(reversed(parts)) + r")(?!\w)", re.IGNORECASE)


def find_blocklist(words: tuple[str, ...], text: str) -> Finding | None:
    found = blocklist_regex(words).search(text)
    if found is None:
        return None
    # The configured word is no secret: name it (as configured, whatever case matched).
    said = " ".join(found.group(0).split()).casefold()
    word = next((w for w in words if " ".join(w.split()).casefold() == said), found.group(0))
    return Finding("blocked word or phrase", repr(word))


@functools.lru_cache(maxsize=256)
def compiled(pattern: str, ignore_case: bool) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE if ignore_case else 0)


def regex_problem(pattern: str, ignore_case: bool = False) -> str | None:
    """Why ``pattern`` may not be a rule's regex (invalid, or shaped for catastrophic
    backtracking, or matching the empty text), or None when it may."""
    try:
        regex = compiled(pattern, ignore_case)
    except re.error as exc:
        return f"invalid regex: {exc}"
    except (OverflowError, RecursionError):
        return "the regex is too large"
    problem = _walk(_parser.parse(pattern, regex.flags), nested=False)
    if problem is None and regex.search("") is not None:
        problem = "the regex matches the empty text, so it would block every text"
    return problem


_REPEATS = ("MAX_REPEAT", "MIN_REPEAT")
_NESTED = (
    "nested repeats such as (a+)+ can take exponential time; make the outer one possessive "
    "(++ or *+), which never gives back what it matched"
)


def _repeat(name: str, av: Any, nested: bool) -> tuple[str | None, bool]:
    """(the problem of one repeat node, whether its body is inside a backtracking repeat)."""
    low, high, _ = av
    if low > MAX_REPEAT_COUNT or (high != _constants.MAXREPEAT and high > MAX_REPEAT_COUNT):
        return f"repeat counts above {MAX_REPEAT_COUNT} are not allowed", nested
    if name == "POSSESSIVE_REPEAT":
        return None, False
    if high > 1:
        return (_NESTED if nested else None), True
    return None, nested


def _walk(items: Iterable[tuple[Any, Any]], *, nested: bool) -> str | None:
    """Refuse nested backtracking repeats (``(a+)+``: exponential time), huge counts and
    backreferences. Inside a possessive repeat nothing is given back: allowed."""
    for op, av in items:
        name = str(op)
        children: list[Any] = []
        inner = nested
        problem: str | None = None
        if name in _REPEATS or name == "POSSESSIVE_REPEAT":
            problem, inner = _repeat(name, av, nested)
            children = [av[2]]
        elif name == "SUBPATTERN":
            children = [av[3]]
        elif name == "ATOMIC_GROUP":
            children = [av]  # backtracking inside the group still happens while it matches
        elif name in ("ASSERT", "ASSERT_NOT"):
            children = [av[1]]
        elif name == "BRANCH":
            children = list(av[1])
        elif name in ("GROUPREF", "GROUPREF_EXISTS"):
            problem = "backreferences are not allowed"
        for child in children:
            problem = problem or _walk(child, nested=inner)
        if problem is not None:
            return problem
    return None


def find_regex(pattern: str, ignore_case: bool, text: str) -> Finding | None:
    found = compiled(pattern, ignore_case).search(text)
    return None if found is None else Finding("a match of the pattern", mask(found.group(0)))


# --- PII -----------------------------------------------------------------------------------------

_EMAIL = re.compile(
    r"(?<![\w.+%-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@(?:[A-Za-z0-9-]{1,63}\.){1,8}[A-Za-z]{2,24}"
    r"(?![\w-])"
)
_PHONE_INTL = re.compile(r"(?<![\w+])\+[1-9][\d .()/-]{6,22}\d(?!\d)")
_PHONE_NANP = re.compile(r"(?<![\w+])(?:\(\d{3}\)[ .-]?|\d{3}[ .-])\d{3}[ .-]\d{4}(?![\w-])")
_PHONE_NATIONAL = re.compile(r"(?<![\w+.,/-])0\d{1,4}[ /.-]\d{2,4}(?:[ .-]?\d{2,4}){1,3}(?![\w.-])")
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d])")
_IBAN = re.compile(r"(?<![A-Za-z0-9])([A-Z]{2})(\d{2})((?: ?[A-Z0-9]){11,30})")
_DIGITS = re.compile(r"\d")
_IBAN_REGISTRY = (
    "AD24 AE23 AL28 AT20 AZ28 BA20 BE16 BG22 BH22 BR29 BY28 CH21 CR22 CY28 CZ24 DE22 DK18 DO28 "
    "EE20 EG29 ES24 FI18 FO18 FR27 GB22 GE22 GI23 GL18 GR27 GT28 HR21 HU28 IE22 IL23 IQ23 IS26 "
    "IT27 JO30 KW30 KZ20 LB28 LC32 LI21 LT20 LU20 LV21 MC27 MD24 ME22 MK19 MR27 MT31 MU30 NL18 "
    "NO15 PK24 PL28 PS29 PT25 QA29 RO24 RS22 SA24 SC31 SE24 SI19 SK24 SM27 ST25 SV28 TL23 TN24 "
    "TR26 UA29 VA22 VG24 XK20"
)
#: IBAN lengths by country (the SWIFT IBAN registry).
IBAN_LENGTHS = {entry[:2]: int(entry[2:]) for entry in _IBAN_REGISTRY.split()}


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum of a card number (digits only)."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char)
        if position % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def iban_valid(iban: str) -> bool:
    """ISO 13616: the registry length for the country, and mod 97 of the rearranged number."""
    if IBAN_LENGTHS.get(iban[:2]) != len(iban):
        return False
    rearranged = iban[4:] + iban[:4]
    return int("".join(str(int(c, 36)) for c in rearranged)) % 97 == 1


def _phone(text: str) -> str | None:
    for regex, low, high in ((_PHONE_INTL, 8, 15), (_PHONE_NANP, 10, 10), (_PHONE_NATIONAL, 9, 12)):
        for found in regex.finditer(text):
            if low <= len(_DIGITS.findall(found.group(0))) <= high:
                return found.group(0)
    return None


def _card(text: str) -> str | None:
    for found in _CARD.finditer(text):
        digits = "".join(_DIGITS.findall(found.group(0)))
        if 13 <= len(digits) <= 19 and luhn_valid(digits):
            return digits
    return None


def _iban(text: str) -> str | None:
    for found in _IBAN.finditer(text):
        country = found.group(1)
        length = IBAN_LENGTHS.get(country)
        compact = (country + found.group(2) + found.group(3)).replace(" ", "")
        if length is not None and len(compact) >= length and iban_valid(compact[:length]):
            return compact[:length]
    return None


def _email(text: str) -> str | None:
    found = _EMAIL.search(text)
    return None if found is None else found.group(0)


_PII: dict[str, tuple[str, Callable[[str], str | None]]] = {
    "email": ("an email address", _email),
    "phone": ("a phone number", _phone),
    "credit_card": ("a credit card number", _card),
    "iban": ("an IBAN", _iban),
}


def find_pii(types: Iterable[str], text: str) -> Finding | None:
    for kind in types:
        label, detect = _PII[kind]
        value = detect(text)
        if value is not None:
            return Finding(label, mask(value))
    return None


# --- secrets -------------------------------------------------------------------------------------

_SECRETS: dict[str, tuple[str, re.Pattern[str]]] = {
    "openai": (
        "an OpenAI API key", re.compile(r"(?<![\w-])sk-(?:proj-|svcacct-|admin-)?[\w-]{20,}")
    ),
    "aws": (
        "an AWS access key id", re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")
    ),
    "github": (
        "a GitHub token",
        re.compile(r"(?<![\w-])(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_\w{22,})"),
    ),
    "slack": ("a Slack token", re.compile(r"(?<![\w-])xox[abposr]-[A-Za-z0-9-]{10,}")),
    "private_key": (
        "a private key block",
        re.compile(r"-----BEGIN (?:[A-Z0-9]+ ){0,4}PRIVATE KEY(?: BLOCK)?-----"),
    ),
    "loopwright": ("a Loopwright API token", re.compile(r"(?<![\w-])lw_[0-9a-f]{12}_[\w-]{20,}")),
}  # fmt: skip


#: A literal every match of the type contains: texts without one skip the regex (fast path).
_SECRET_MARKERS: dict[str, tuple[str, ...]] = {
    "openai": ("sk-",),
    "aws": ("AKIA", "ASIA"),
    "github": ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    "slack": ("xox",),
    "private_key": ("PRIVATE KEY",),
    "loopwright": ("lw_",),
}


def find_secret(types: Iterable[str], text: str) -> Finding | None:
    for kind in types:
        if not any(marker in text for marker in _SECRET_MARKERS[kind]):
            continue
        label, regex = _SECRETS[kind]
        found = regex.search(text)
        if found is not None:
            # A key block's header is no secret, and the key itself is not in the match.
            return Finding(label, found.group(0) if kind == "private_key" else mask(found.group(0)))
    return None
