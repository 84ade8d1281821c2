"""Preparations of ``/v1/chat/completions`` reused while nothing they were read from changed.

Holds: a reused preparation is what the full read (token, user, roles, grant, employee profile,
chat settings, harness) would give now. One query, :data:`STAMP_SQL`, reads every row that read
depends on, and a preparation is reused only under an identical :class:`Stamp` (and the same
platform harness override); the token's secret and expiry are still checked on every request,
and its use still recorded. Any change (a revoked or expired token, a deactivated user, a
changed role or grant, an edited employee, endpoint, failover chain, sub-agent binding,
guardrail or harness profile) misses, and the full read runs and answers as it always does.
The same query reads the token's daily quotas and its usage today (:mod:`gateway.token_quotas`),
never part of the stamp's key: usage grows with every request.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from django.conf import settings
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from gateway.token_quotas import TokenQuota, usage_day
from orchestrator.accounts.roles import Role
from orchestrator.agents.wiring import PROFILE_SIGNATURE_COLUMNS
from orchestrator.sql import fetch_one_prepared

T = TypeVar("T")

#: Constant text (S608 waived): the role name, the day, the token prefix and the username are
#: parameters.
STAMP_SQL = (
    "SELECT t.id, t.secret_hash, t.revoked_at, t.expires_at, t.last_used_at, "  # noqa: S608
    "t.daily_token_quota, t.daily_cost_quota, q.tokens, q.cost, "
    "u.id, u.is_active, u.is_superuser, "
    "(SELECT COUNT(*) FROM auth_user_groups ug WHERE ug.user_id = u.id), "
    "(SELECT MAX(ug.id) FROM auth_user_groups ug WHERE ug.user_id = u.id), "
    "(SELECT COUNT(*) FROM auth_user_groups ug JOIN auth_group r ON r.id = ug.group_id "
    "WHERE ug.user_id = u.id AND r.name = %s), "
    "(SELECT COUNT(*) FROM gateway_employeegrant g "
    "WHERE g.employee_id = e.id AND g.user_id = u.id), "
    f"e.id, {PROFILE_SIGNATURE_COLUMNS}, "
    "(SELECT s.updated_at FROM gateway_employeechatsettings s WHERE s.employee_id = e.id), "
    "(SELECT COUNT(*) FROM harness_harnessprofile p), "
    "(SELECT MAX(p.updated_at) FROM harness_harnessprofile p), "
    "(SELECT MAX(v.updated_at) FROM harness_harnessprofileversion v) "
    "FROM accounts_apitoken t JOIN auth_user u ON u.id = t.user_id "
    "LEFT JOIN gateway_tokenusageday q ON q.token_id = t.id AND q.day = %s "
    "CROSS JOIN agents_employee e JOIN agents_modelendpoint ep ON ep.id = e.endpoint_id "
    "WHERE t.prefix = %s AND e.username = %s"
)


def _moment(value: Any) -> datetime | None:
    """A timestamp column as an aware datetime (SQLite's cursor gives text)."""
    text = value is not None and not isinstance(value, datetime)
    moment = parse_datetime(str(value)) if text else value
    if moment is not None and timezone.is_naive(moment):
        moment = moment.replace(tzinfo=UTC)
    return moment


@dataclass(frozen=True)
class Stamp:
    """What a preparation for one token and one employee was read from."""

    token_id: int
    secret_hash: str
    revoked_at: datetime | None
    expires_at: datetime | None
    #: Not part of :attr:`key`: recording a use must not make the next request miss.
    last_used_at: datetime | None
    key: tuple[Any, ...]
    #: Not part of :attr:`key` either: the token's quotas and usage, read fresh every request.
    quota: TokenQuota | None = None


def stamp_read(prefix: str, username: str) -> Stamp | None:
    """The stamp of token ``prefix`` calling employee ``username``; None when either is unknown
    (call on a thread with a database connection)."""
    day = usage_day(timezone.now())
    row = fetch_one_prepared(
        "loopwright_gateway_stamp",
        STAMP_SQL,
        [Role.ADMIN.value, day.isoformat(), prefix, username],
    )
    if row is None:
        return None
    platform = repr(getattr(settings, "LOOPWRIGHT_HARNESS_PLATFORM", {}))
    token_id, secret_hash, revoked_at, expires_at, last_used_at, *rest = row
    quota = TokenQuota.of_row(token_id, prefix, day, (rest[0], rest[1]), (rest[2], rest[3]))
    rest = rest[4:]
    return Stamp(
        token_id=int(token_id),
        secret_hash=str(secret_hash),
        revoked_at=_moment(revoked_at),
        expires_at=_moment(expires_at),
        last_used_at=_moment(last_used_at),
        key=(token_id, secret_hash, revoked_at, expires_at, platform, *rest),
        quota=quota,
    )


class ReuseCache(Generic[T]):
    """Values by ``(token prefix, employee)``, each given back only under its own stamp.

    At most ``capacity`` entries (all dropped when full: a stale entry only costs a full read).
    """

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._entries: dict[tuple[str, str], tuple[tuple[Any, ...], T]] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str], stamp: Stamp) -> T | None:
        with self._lock:
            found = self._entries.get(key)
        if found is None or found[0] != stamp.key:
            return None
        return found[1]

    def put(self, key: tuple[str, str], stamp: Stamp, value: T) -> None:
        with self._lock:
            if len(self._entries) >= self.capacity:
                self._entries.clear()
            self._entries[key] = (stamp.key, value)
