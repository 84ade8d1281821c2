"""``s3`` skill sources: ``s3://bucket/prefix/`` in a bucket an admin lists, nothing else.

The rule, checked when a skill is saved and again each time its objects are fetched into the
sandbox (the list may have changed since):

- buckets come from ``LOOPWRIGHT_SKILL_S3_BUCKETS`` (comma-separated S3 bucket names); there are
  none by default, so every s3 skill is refused;
- ``source_ref`` is ``s3://<bucket>/`` or ``s3://<bucket>/<prefix>/`` (the trailing ``/`` is
  implied): a valid bucket name, and a prefix without empty, ``.`` or ``..`` segments,
  backslashes or control characters;
- every object key under the prefix, relative to it, follows the same segment rule (checked by
  :func:`key_problem` when the objects are listed).

Only the format and the allow list are checked at save time: the API's host may have no
credentials for the store. This module needs no boto3 (the settings import it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.conf import settings

from sandbox import SandboxError

SETTING = "LOOPWRIGHT_SKILL_S3_BUCKETS"
SCHEME = "s3://"
#: S3's bucket naming rule (3-63 characters, lower-case letters, digits, '.', '-').
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class S3Refused(SandboxError):
    """An s3 source the rule does not allow, or one that cannot be read; the message says
    which (it never holds credentials)."""


@dataclass(frozen=True)
class S3Location:
    """A checked ``source_ref``: the bucket and the prefix (``""`` or ending in ``/``)."""

    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}"


def bucket_problem(name: str) -> str | None:
    """Why ``name`` is not an S3 bucket name, or None."""
    if not _BUCKET.fullmatch(name) or ".." in name:
        return "is not a bucket name (3-63 lower-case letters, digits, '.' or '-')"
    return None


def parse_s3_buckets(value: str | None) -> tuple[str, ...]:
    """The buckets of ``LOOPWRIGHT_SKILL_S3_BUCKETS``; ValueError naming the setting for a bad
    name."""
    buckets: list[str] = []
    for part in (value or "").split(","):
        name = part.strip()
        if not name:
            continue
        problem = bucket_problem(name)
        if problem:
            raise ValueError(f"{SETTING}: {name!r} {problem}")
        buckets.append(name)
    return tuple(dict.fromkeys(buckets))


def key_problem(path: str) -> str | None:
    """Why a relative object path (or prefix, without its trailing ``/``) cannot be a file path
    in the sandbox, or None: absolute, empty, ``.`` or ``..`` segments, backslashes, control
    characters."""
    if path.startswith("/"):
        return "is absolute"
    if "\\" in path or _CONTROL.search(path):
        return "holds a backslash or a control character"
    if any(segment in ("", ".", "..") for segment in path.split("/")):
        return "has an empty, '.' or '..' segment"
    return None


def configured_buckets() -> tuple[str, ...]:
    return tuple(str(b) for b in settings.SKILLHUB.get("S3_BUCKETS", ()) or ())


def s3_check(ref: str) -> S3Location:
    """The bucket and prefix of an s3 ``source_ref``; S3Refused naming the rule."""
    buckets = configured_buckets()
    if not buckets:
        raise S3Refused(
            f"s3 skills are off: no bucket is allowed until an admin lists buckets in {SETTING} "
            "(none by default)"
        )
    if not isinstance(ref, str) or not ref.startswith(SCHEME):
        raise S3Refused("an s3 skill needs a source_ref of the form s3://bucket/prefix/")
    bucket, _, prefix = ref[len(SCHEME) :].partition("/")
    problem = bucket_problem(bucket)
    if problem:
        raise S3Refused(f"{bucket!r} {problem}")
    prefix = prefix.rstrip("/")
    problem = key_problem(prefix) if prefix else None
    if problem:
        raise S3Refused(f"the prefix {prefix!r} {problem}; give the plain prefix")
    if bucket not in buckets:
        raise S3Refused(
            f"the bucket {bucket!r} is not one allowed by {SETTING} ({', '.join(buckets)})"
        )
    return S3Location(bucket=bucket, prefix=f"{prefix}/" if prefix else "")
