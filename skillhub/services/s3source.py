"""Fetching an ``s3`` skill's objects (boto3) into the sandbox's working directory at each run.

The location is checked again first (``skillhub.services.s3ref``: the bucket allow list and the
format). Then every object under the prefix is listed before any is read: more than
``MAX_ENTRIES`` objects, a total over ``S3_MAX_BYTES``, a key that is not a safe relative path
or a key that is both a file and a folder refuses the whole fetch. Folder markers (keys ending
in ``/``) and archived objects (Glacier classes) are skipped, so is ``.git``. Each object is
read back to its listed size, never more. No cache: each run reads the bucket as it is then.

The client has connect/read timeouts and bounded retries (``LOOPWRIGHT_SKILL_S3_TIMEOUT_SECONDS``),
so an unreachable store fails the execution instead of hanging it; credentials come from the
standard AWS chain and never appear in a message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings

from sandbox import MiB
from skillhub.services.localdir import LocalCopy
from skillhub.services.s3ref import S3Location, S3Refused, key_problem, s3_check

#: Largest total of an s3 skill's objects, and most objects under its prefix (as local-dir).
S3_MAX_BYTES = 50 * MiB
MAX_ENTRIES = 50_000
#: Storage classes whose objects cannot be read without a restore first.
_ARCHIVED = frozenset({"GLACIER", "DEEP_ARCHIVE"})
_DENIED = frozenset({"AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"})
_MISSING = frozenset({"NoSuchBucket", "NoSuchKey", "404"})


@dataclass(frozen=True)
class _Object:
    key: str
    rel: str
    size: int


def _client() -> Any:
    """A fresh S3 client (boto3 clients are built per fetch: sessions are not thread-safe)."""
    config = settings.SKILLHUB
    endpoint = str(config.get("S3_ENDPOINT_URL") or "") or None
    timeout = float(config.get("S3_TIMEOUT_SECONDS") or 10.0)
    client_config = Config(
        connect_timeout=timeout,
        read_timeout=timeout,
        retries={"max_attempts": 2, "mode": "standard"},
        # S3-compatible stores (MinIO, Ceph, moto) are usually addressed by path.
        s3={"addressing_style": "path" if endpoint else "auto"},
    )
    session = boto3.session.Session()
    return session.client(
        "s3",
        endpoint_url=endpoint,
        region_name=str(config.get("S3_REGION") or "") or None,
        config=client_config,
    )


def s3_files(ref: str, max_bytes: int = S3_MAX_BYTES, max_entries: int = MAX_ENTRIES) -> LocalCopy:
    """The objects under an s3 skill's prefix (relative key -> bytes); S3Refused when the rule
    refuses the location, the bucket or prefix is missing, access is denied, the store cannot be
    reached in time, a key is unsafe, or the objects are over ``max_bytes`` / ``max_entries``."""
    where = s3_check(ref)
    try:
        client = _client()
        copy = LocalCopy()
        objects = _listed(client, where, max_entries, copy)
        total = sum(item.size for item in objects)
        if total > max_bytes:
            raise S3Refused(f"the objects under {where.url} are over {max_bytes} bytes ({total})")
        for item in objects:
            copy.files[item.rel] = _read(client, where, item)
        return copy
    except ClientError as exc:
        raise S3Refused(_client_error_text(exc, where)) from None
    except BotoCoreError as exc:  # no credentials, unreachable endpoint, timeouts
        raise S3Refused(f"{where.url} cannot be read: {exc}") from None


def _listed(client: Any, where: S3Location, max_entries: int, copy: LocalCopy) -> list[_Object]:
    """Every object to copy, checked before any is read; skipped ones go to ``copy.skipped``."""
    found: list[_Object] = []
    seen = 0
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=where.bucket, Prefix=where.prefix, PaginationConfig={"PageSize": 1000}
    )
    for page in pages:
        for item in page.get("Contents", ()):
            seen += 1
            if seen > max_entries:
                raise S3Refused(f"{where.url} holds more than {max_entries} objects")
            rel = str(item["Key"])[len(where.prefix) :]
            if _skipped(rel, item, copy):
                continue
            problem = key_problem(rel)
            if problem:
                raise S3Refused(
                    f"the object key {rel[:200]!r} under {where.url} {problem}; "
                    "keys must be plain relative paths"
                )
            found.append(_Object(key=str(item["Key"]), rel=rel, size=int(item.get("Size", 0))))
    if not seen:
        raise S3Refused(f"no objects under {where.url}: the prefix is missing or empty")
    _no_file_folder_clash(found, where)
    return found


def _skipped(rel: str, item: dict[str, Any], copy: LocalCopy) -> bool:
    if rel.endswith("/") and not int(item.get("Size", 0)):
        return True  # a folder marker written by consoles
    if rel == ".git" or rel.startswith(".git/"):
        return True
    if item.get("StorageClass") in _ARCHIVED:
        copy.skipped.append(rel)
        return True
    return False


def _no_file_folder_clash(found: list[_Object], where: S3Location) -> None:
    files = {item.rel for item in found}
    for item in found:
        parts = item.rel.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            folder = "/".join(parts[:depth])
            if folder in files:
                raise S3Refused(f"{folder!r} under {where.url} is both an object and a folder")


def _read(client: Any, where: S3Location, item: _Object) -> bytes:
    body = client.get_object(Bucket=where.bucket, Key=item.key)["Body"]
    try:
        data = bytes(body.read(item.size + 1))
    finally:
        body.close()
    if len(data) != item.size:
        raise S3Refused(f"{item.rel} under {where.url} changed while it was fetched")
    return data


def _client_error_text(exc: ClientError, where: S3Location) -> str:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    if code in _MISSING:
        return f"{where.url} cannot be read: the bucket or an object is missing ({code})"
    if code in _DENIED:
        return f"{where.url} cannot be read: access denied ({code}); check the workers' credentials"
    return f"{where.url} cannot be read: {code or 'error'}: {error.get('Message', '')}".rstrip()
