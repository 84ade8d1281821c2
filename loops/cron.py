"""Cron arithmetic, pure: fire times of an expression in a time zone, across DST changes.

Semantics (docs/triggers.md): an expression names *wall-clock* times in the pattern's zone, and
every matching wall-clock time fires exactly once, at the instant ``fire_instant`` maps it to:

- an ordinary wall time is the instant it names;
- a wall time that occurs twice (the repeated hour when clocks go back) fires once, at its
  first occurrence; the second pass of that hour fires nothing;
- a wall time that does not exist (the skipped hour when clocks go forward) fires once, at the
  end of the gap (the first instant after the clock jumped), like Vixie cron. Several skipped
  times, or a skipped time and the real time at the end of the gap, fall on the same instant and
  are one fire.

The mapping never decreases, so fire instants come out in order. croniter (7.0) is used on
naive wall-clock datetimes only: with aware datetimes it fires the repeated hour twice.

Everything here takes ``now`` or an instant as an argument and returns aware UTC datetimes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

#: Missed fire times counted one by one after downtime; beyond this the count is reported as
#: "at least" (the latest due time is still found exactly).
MISSED_COUNT_CAP = 1000
#: Bound on the steps taken through a repeated hour (a seconds field gives 3,600 per hour).
_MAX_FOLD_STEPS = 20_000
_local = threading.local()


class CronInvalid(ValueError):
    """An expression or time zone that cannot be scheduled."""


@dataclass(frozen=True)
class CronSpec:
    """What a schedule is computed from. ``hash_id`` seeds croniter's ``H`` fields."""

    expression: str
    timezone: str = "UTC"
    hash_id: str | None = None


@dataclass(frozen=True)
class DueFires:
    """The fire times in ``(after, now]`` and what comes next.

    ``latest`` is the last due time (None when nothing is due), ``count`` how many are due
    (at most ``MISSED_COUNT_CAP``; ``count_capped`` says it is a lower bound), ``next_after``
    the first fire time after ``now`` (None when the expression never fires again).
    """

    latest: datetime | None
    count: int
    count_capped: bool
    next_after: datetime | None


@lru_cache(maxsize=512)
def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise CronInvalid(f"Unknown time zone {name!r}.") from exc


#: The fields of an expression in croniter's order: a sixth field is seconds, a seventh the year.
CRON_FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week", "second", "year")
#: croniter syntax the scheduler does not honour: ``H`` is seeded per process by whatever id is
#: passed, ``R`` is drawn anew at every parse, so neither names fixed times.
_UNSUPPORTED = {"H": "hashed values (H)", "R": "random values (R)"}


def unsupported_field(expression: str) -> str | None:
    """A sentence naming the first field that uses syntax the scheduler does not honour."""
    if expression.strip().startswith("@"):
        return None
    for name, field in zip(CRON_FIELDS, expression.split(), strict=False):
        for part in field.split(","):
            what = _UNSUPPORTED.get(part[:1].upper())
            if what is not None:
                return f"the {name} field ({field!r}) uses {what}, which are not supported"
    return None


def cron_validate(spec: CronSpec, now: datetime | None = None) -> None:
    """Raise CronInvalid naming what is wrong with the expression or the zone; with ``now``,
    also refuse an expression that never fires again (within croniter's 50-year horizon)."""
    zone(spec.timezone)
    if not spec.expression.strip():
        raise CronInvalid("The cron expression is empty.")
    unsupported = unsupported_field(spec.expression)
    if unsupported is not None:
        raise CronInvalid(
            f"{spec.expression!r} is not a valid cron expression here: {unsupported}."
        )
    hash_id = spec.hash_id.encode("utf-8") if spec.hash_id else None
    if not croniter.is_valid(spec.expression, hash_id=hash_id):
        raise CronInvalid(f"{spec.expression!r} is not a valid cron expression.")
    if now is not None and next_fire_after(spec, now) is None:
        raise CronInvalid(f"{spec.expression!r} never fires after {now:%Y-%m-%d}.")


def _iterator(spec: CronSpec) -> croniter[datetime]:
    """A parsed croniter for this thread (they keep a cursor, so threads must not share one)."""
    cache: dict[tuple[str, str | None], croniter[datetime]] | None = getattr(_local, "cache", None)
    if cache is None or len(cache) > 2048:
        cache = _local.cache = {}
    key = (spec.expression, spec.hash_id)
    found = cache.get(key)
    if found is None:
        try:
            found = croniter(
                spec.expression, datetime(2000, 1, 1), ret_type=datetime, hash_id=spec.hash_id
            )
        except CroniterError as exc:
            raise CronInvalid(f"{spec.expression!r} is not a valid cron expression.") from exc
        cache[key] = found
    return found


def _wall_next(spec: CronSpec, wall: datetime) -> datetime | None:
    """The first matching naive wall time strictly after ``wall``."""
    try:
        return _iterator(spec).get_next(datetime, start_time=wall)
    except CroniterBadDateError:  # no match within croniter's search horizon (50 years)
        return None


def _wall_prev_or_equal(spec: CronSpec, wall: datetime) -> datetime | None:
    """The last matching naive wall time at or before ``wall``."""
    iterator = _iterator(spec)
    seconds_field = len(iterator.expanded) > 5
    unit = timedelta(seconds=1) if seconds_field else timedelta(minutes=1)
    floor = wall.replace(microsecond=0) if seconds_field else wall.replace(second=0, microsecond=0)
    # croniter looks at or before the start minus a microsecond, truncated to its unit; start
    # half a unit past the floor so float rounding of the timestamp cannot lose the floor.
    try:
        return iterator.get_prev(datetime, start_time=floor + unit / 2)
    except CroniterBadDateError:
        return None


def wall_time(instant: datetime, tz: ZoneInfo) -> datetime:
    """The naive wall-clock time of ``instant`` in ``tz``."""
    # Through UTC: astimezone() into the instant's own zone would return it unchanged, even
    # when it names a wall time that does not exist.
    return instant.astimezone(UTC).astimezone(tz).replace(tzinfo=None, fold=0)


def _exists(wall: datetime, tz: ZoneInfo) -> bool:
    return wall_time(wall.replace(tzinfo=tz), tz) == wall


def _gap_end(wall: datetime, tz: ZoneInfo) -> datetime:
    """The first instant whose wall time is past ``wall`` (a time inside a DST gap)."""
    # fold=1 reads the time with the offset after the change and lands before the gap,
    # fold=0 with the offset before it and lands after: bisect on whole seconds in between.
    low = int(wall.replace(tzinfo=tz, fold=1).timestamp())
    high = int(wall.replace(tzinfo=tz, fold=0).timestamp())
    if high <= low:
        low, high = high, low
    while high - low > 1:
        middle = (low + high) // 2
        if wall_time(datetime.fromtimestamp(middle, UTC), tz) > wall:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)


def fire_instant(wall: datetime, tz: ZoneInfo) -> datetime:
    """The UTC instant a matching wall time fires at (see the module docstring)."""
    first = wall.replace(tzinfo=tz, fold=0)
    if not _exists(wall, tz):
        return _gap_end(wall, tz)
    return first.astimezone(UTC)  # fold=0 is the first of two occurrences


def next_fire_after(spec: CronSpec, instant: datetime) -> datetime | None:
    """The first fire time strictly after ``instant`` (aware), or None if there is none."""
    tz = zone(spec.timezone)
    wall: datetime | None = wall_time(instant, tz)
    for _ in range(_MAX_FOLD_STEPS):
        assert wall is not None
        wall = _wall_next(spec, wall)
        if wall is None:
            return None
        fire = fire_instant(wall, tz)
        # Only in the second pass of a repeated hour do later wall times map to earlier
        # instants (their first occurrence, already past): step over them.
        if fire > instant:
            return fire
    raise CronInvalid(f"{spec.expression!r}: no fire time found after {instant.isoformat()}.")


def next_fires(spec: CronSpec, after: datetime, count: int) -> list[datetime]:
    """The next ``count`` fire times strictly after ``after``."""
    fires: list[datetime] = []
    cursor = after
    while len(fires) < count:
        fire = next_fire_after(spec, cursor)
        if fire is None:
            break
        fires.append(fire)
        cursor = fire
    return fires


def latest_fire_at_or_before(spec: CronSpec, now: datetime) -> datetime | None:
    """The last fire time at or before ``now``, or None if there is none."""
    tz = zone(spec.timezone)
    wall = _wall_prev_or_equal(spec, wall_time(now, tz))
    if wall is None:
        return None
    latest = fire_instant(wall, tz)
    # In the second pass of a repeated hour, matching wall times after ``now``'s wall time
    # already fired in the first pass: walk forward over them.
    for _ in range(_MAX_FOLD_STEPS):
        following = _wall_next(spec, wall)
        if following is None:
            return latest
        fire = fire_instant(following, tz)
        if fire > now:
            return latest
        wall, latest = following, fire
    return latest


def due_fires(spec: CronSpec, first: datetime, now: datetime) -> DueFires:
    """The fire times from ``first`` (a fire time not yet handled) up to ``now``.

    Counting stops at ``MISSED_COUNT_CAP``; the latest due time and the next one after ``now``
    are then found directly, so long downtime costs no more than a short one.
    """
    if first > now:
        return DueFires(latest=None, count=0, count_capped=False, next_after=first)
    latest, count = first, 1
    fire = next_fire_after(spec, first)
    while fire is not None and fire <= now:
        if count >= MISSED_COUNT_CAP:
            return DueFires(
                latest=latest_fire_at_or_before(spec, now),
                count=count,
                count_capped=True,
                next_after=next_fire_after(spec, now),
            )
        latest, count = fire, count + 1
        fire = next_fire_after(spec, fire)
    return DueFires(latest=latest, count=count, count_capped=False, next_after=fire)


@dataclass(frozen=True)
class FireDecision:
    """What one tick does with the due times of a schedule.

    ``fire_at`` is the scheduled time of the one run to start (None: start nothing);
    ``missed`` is how many due times are folded into it (coalesce) or dropped (skip).
    """

    fire_at: datetime | None
    missed: int
    missed_capped: bool


def fire_decision(due: DueFires, *, policy: str, now: datetime, grace: timedelta) -> FireDecision:
    """Apply the missed-fire policy to the due times of one schedule.

    A due time is *on time* when the tick runs within ``grace`` of it. ``coalesce`` starts one
    run for the latest due time, however late, and counts the earlier ones as missed. ``skip``
    starts a run only for an on-time latest due time; every other due time is dropped.
    """
    if due.latest is None:
        return FireDecision(fire_at=None, missed=0, missed_capped=False)
    on_time = now - due.latest <= grace
    if policy == "skip" and not on_time:
        return FireDecision(fire_at=None, missed=due.count, missed_capped=due.count_capped)
    return FireDecision(fire_at=due.latest, missed=due.count - 1, missed_capped=due.count_capped)
