"""Cron arithmetic without a database: fire times, DST in two zones, due times and policies."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from loops.cron import (
    MISSED_COUNT_CAP,
    CronInvalid,
    CronSpec,
    DueFires,
    cron_validate,
    due_fires,
    fire_decision,
    latest_fire_at_or_before,
    next_fire_after,
    next_fires,
    wall_time,
)

NY = "America/New_York"
BERLIN = "Europe/Berlin"


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def local(
    zone: str, year: int, month: int, day: int, hour: int = 0, minute: int = 0, *, fold: int = 0
) -> datetime:
    moment = datetime(year, month, day, hour, minute, tzinfo=ZoneInfo(zone), fold=fold)
    return moment.astimezone(UTC)


def walls(zone: str, fires: list[datetime]) -> list[str]:
    """Fire times as local wall clock with the UTC offset, e.g. '03-09 03:00-04:00'."""
    tz = ZoneInfo(zone)
    return [f.astimezone(tz).strftime("%m-%d %H:%M%z") for f in fires]


# --- plain schedules --------------------------------------------------------------------------


def test_every_fifteen_minutes_in_utc_counts_from_the_next_quarter() -> None:
    fires = next_fires(CronSpec("*/15 * * * *"), utc(2030, 1, 7, 9, 7, 30), 3)
    assert fires == [utc(2030, 1, 7, 9, 15), utc(2030, 1, 7, 9, 30), utc(2030, 1, 7, 9, 45)]


def test_next_fire_is_strictly_after_the_instant_given() -> None:
    assert next_fire_after(CronSpec("0 9 * * *"), utc(2030, 1, 7, 9)) == utc(2030, 1, 8, 9)


def test_a_zone_shifts_the_instants_but_not_the_wall_clock() -> None:
    fires = next_fires(CronSpec("0 9 * * 1-5", "Asia/Tokyo"), utc(2030, 1, 4, 12), 2)
    assert fires == [utc(2030, 1, 7, 0), utc(2030, 1, 8, 0)]  # Monday, Tuesday 09:00 JST


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("@daily", utc(2030, 1, 7, 9), utc(2030, 1, 8)),
        ("@hourly", utc(2030, 1, 7, 9, 1), utc(2030, 1, 7, 10)),
        ("0 0 L * *", utc(2030, 2, 1), utc(2030, 2, 28)),  # last day of the month
        ("0 0 * * 1#2", utc(2030, 1, 1), utc(2030, 1, 14)),  # second Monday
        ("0 0 15W * *", utc(2030, 6, 1), utc(2030, 6, 14)),  # nearest weekday to the 15th
        ("0 9 * jan,feb mon", utc(2030, 1, 7, 10), utc(2030, 1, 14, 9)),  # names
        ("* * * * * 30", utc(2030, 1, 7, 9, 0, 0), utc(2030, 1, 7, 9, 0, 30)),  # seconds last
    ],
)
def test_the_extensions_croniter_accepts(
    expression: str, after: datetime, expected: datetime
) -> None:
    cron_validate(CronSpec(expression))
    assert next_fire_after(CronSpec(expression), after) == expected


def test_hashed_fields_are_stable_per_pattern_key() -> None:
    first = next_fire_after(CronSpec("H * * * *", hash_id="nightly"), utc(2030, 1, 7, 9))
    again = next_fire_after(CronSpec("H * * * *", hash_id="nightly"), utc(2030, 1, 7, 9))
    assert first == again and first is not None and first.hour in (9, 10)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (CronSpec("61 * * * *"), "not a valid cron expression"),
        (CronSpec("   "), "empty"),
        (CronSpec("* * * * *", "Mars/Olympus"), "Unknown time zone"),
        (CronSpec("H * * * *"), "not a valid cron expression"),  # hashing needs a pattern key
    ],
)
def test_invalid_expressions_and_zones_are_named(spec: CronSpec, message: str) -> None:
    with pytest.raises(CronInvalid, match=message):
        cron_validate(spec)


def test_an_expression_that_never_matches_has_no_next_fire() -> None:
    assert next_fire_after(CronSpec("0 0 30 2 *"), utc(2030, 1, 1)) is None


# --- DST: New York and Berlin, both transitions -----------------------------------------------
# New York: 2030-03-10 02:00 EST → 03:00 EDT; 2030-11-03 02:00 EDT → 01:00 EST.
# Berlin:   2030-03-31 02:00 CET → 03:00 CEST; 2030-10-27 03:00 CEST → 02:00 CET.


def test_new_york_spring_forward_fires_a_skipped_daily_time_once_when_the_clock_jumps() -> None:
    fires = next_fires(CronSpec("30 2 * * *", NY), utc(2030, 3, 9, 12), 3)
    assert walls(NY, fires) == ["03-10 03:00-0400", "03-11 02:30-0400", "03-12 02:30-0400"]
    assert fires[0] == utc(2030, 3, 10, 7)  # the instant of the change


def test_new_york_spring_forward_hourly_has_no_fire_in_the_missing_hour() -> None:
    fires = next_fires(CronSpec("0 * * * *", NY), local(NY, 2030, 3, 10, 0, 30), 3)
    assert walls(NY, fires) == ["03-10 01:00-0500", "03-10 03:00-0400", "03-10 04:00-0400"]


def test_new_york_fall_back_fires_a_repeated_daily_time_once_at_its_first_occurrence() -> None:
    fires = next_fires(CronSpec("30 1 * * *", NY), utc(2030, 11, 2, 12), 3)
    assert walls(NY, fires) == ["11-03 01:30-0400", "11-04 01:30-0500", "11-05 01:30-0500"]


def test_new_york_fall_back_hourly_fires_the_repeated_hour_once() -> None:
    fires = next_fires(CronSpec("0 * * * *", NY), local(NY, 2030, 11, 2, 23, 30), 4)
    assert walls(NY, fires) == [
        "11-03 00:00-0400",
        "11-03 01:00-0400",
        "11-03 02:00-0500",  # 01:00 EST (the second 01:00) does not fire
        "11-03 03:00-0500",
    ]


def test_new_york_fall_back_daily_at_0230_is_untouched() -> None:
    fires = next_fires(CronSpec("30 2 * * *", NY), utc(2030, 11, 2, 12), 2)
    assert walls(NY, fires) == ["11-03 02:30-0500", "11-04 02:30-0500"]


def test_berlin_spring_forward_fires_a_skipped_daily_time_once_when_the_clock_jumps() -> None:
    fires = next_fires(CronSpec("30 2 * * *", BERLIN), utc(2030, 3, 30, 12), 2)
    assert walls(BERLIN, fires) == ["03-31 03:00+0200", "04-01 02:30+0200"]
    assert fires[0] == utc(2030, 3, 31, 1)


def test_berlin_spring_forward_hourly_has_no_fire_in_the_missing_hour() -> None:
    fires = next_fires(CronSpec("0 * * * *", BERLIN), local(BERLIN, 2030, 3, 31, 0, 30), 3)
    assert walls(BERLIN, fires) == ["03-31 01:00+0100", "03-31 03:00+0200", "03-31 04:00+0200"]


def test_berlin_fall_back_fires_a_repeated_daily_time_once_at_its_first_occurrence() -> None:
    fires = next_fires(CronSpec("30 2 * * *", BERLIN), utc(2030, 10, 26, 12), 2)
    assert walls(BERLIN, fires) == ["10-27 02:30+0200", "10-28 02:30+0100"]


def test_berlin_fall_back_hourly_fires_the_repeated_hour_once() -> None:
    fires = next_fires(CronSpec("0 * * * *", BERLIN), local(BERLIN, 2030, 10, 27, 0, 30), 4)
    assert walls(BERLIN, fires) == [
        "10-27 01:00+0200",
        "10-27 02:00+0200",
        "10-27 03:00+0100",  # 02:00 CET (the second 02:00) does not fire
        "10-27 04:00+0100",
    ]


def test_skipped_times_in_a_gap_collapse_into_one_fire_at_the_jump() -> None:
    fires = next_fires(CronSpec("*/20 * * * *", BERLIN), local(BERLIN, 2030, 3, 31, 1, 30), 4)
    # 02:00, 02:20 and 02:40 do not exist; they are one fire at 03:00 with 03:00 itself.
    assert walls(BERLIN, fires) == [
        "03-31 01:40+0100",
        "03-31 03:00+0200",
        "03-31 03:20+0200",
        "03-31 03:40+0200",
    ]


def test_starting_inside_the_second_pass_of_a_repeated_hour_does_not_fire_it_again() -> None:
    second_pass = local(NY, 2030, 11, 3, 1, 10, fold=1)  # 01:10 EST, after 01:59 EDT
    spec = CronSpec("*/15 * * * *", NY)
    assert walls(NY, [next_fire_after(spec, second_pass)]) == ["11-03 02:00-0500"]  # type: ignore[list-item]
    latest = latest_fire_at_or_before(spec, second_pass)
    assert latest is not None and walls(NY, [latest]) == ["11-03 01:45-0400"]


def test_croniter_alone_would_fire_the_repeated_hour_twice() -> None:
    """Why the module walks naive wall-clock times instead of using aware croniter."""
    start = datetime(2030, 11, 2, 12, tzinfo=ZoneInfo(NY))
    it = croniter("30 1 * * *", start)
    first, second = it.get_next(datetime), it.get_next(datetime)
    assert first.date() == second.date()  # both on 2030-11-03: 01:30 EDT and 01:30 EST


# --- due times, coalescing and skipping -------------------------------------------------------


def test_due_fires_counts_every_missed_time_and_finds_the_next() -> None:
    due = due_fires(CronSpec("*/5 * * * *"), utc(2030, 1, 7, 9), utc(2030, 1, 7, 10, 2))
    assert due == DueFires(
        latest=utc(2030, 1, 7, 10), count=13, count_capped=False, next_after=utc(2030, 1, 7, 10, 5)
    )


def test_nothing_is_due_before_the_first_fire_time() -> None:
    due = due_fires(CronSpec("0 * * * *"), utc(2030, 1, 7, 10), utc(2030, 1, 7, 9, 59))
    assert due.latest is None and due.count == 0 and due.next_after == utc(2030, 1, 7, 10)


def test_a_due_time_exactly_now_is_due() -> None:
    due = due_fires(CronSpec("0 * * * *"), utc(2030, 1, 7, 10), utc(2030, 1, 7, 10))
    assert due.latest == utc(2030, 1, 7, 10) and due.count == 1


def test_long_downtime_caps_the_count_but_still_finds_the_latest_time() -> None:
    due = due_fires(CronSpec("* * * * *"), utc(2030, 1, 1), utc(2030, 1, 31, 12, 0, 30))
    assert due.count == MISSED_COUNT_CAP and due.count_capped
    assert due.latest == utc(2030, 1, 31, 12) and due.next_after == utc(2030, 1, 31, 12, 1)


def test_long_downtime_across_a_fall_back_finds_the_first_pass_latest() -> None:
    now = local(NY, 2030, 11, 3, 1, 20, fold=1)  # in the second pass
    due = due_fires(CronSpec("* * * * *", NY), local(NY, 2030, 11, 1, 0, 0), now)
    assert due.count_capped and due.latest is not None
    assert walls(NY, [due.latest]) == ["11-03 01:59-0400"]
    assert due.next_after is not None and walls(NY, [due.next_after]) == ["11-03 02:00-0500"]


GRACE = timedelta(seconds=60)


def test_coalesce_fires_once_for_the_latest_due_time_however_late() -> None:
    due = DueFires(utc(2030, 1, 7, 10), 13, False, utc(2030, 1, 7, 10, 5))
    decision = fire_decision(due, policy="coalesce", now=utc(2030, 1, 7, 10, 2), grace=GRACE)
    assert (decision.fire_at, decision.missed) == (utc(2030, 1, 7, 10), 12)


def test_skip_fires_nothing_when_the_latest_due_time_is_past_the_grace() -> None:
    due = DueFires(utc(2030, 1, 7, 10), 13, False, utc(2030, 1, 7, 10, 5))
    decision = fire_decision(due, policy="skip", now=utc(2030, 1, 7, 10, 2), grace=GRACE)
    assert (decision.fire_at, decision.missed) == (None, 13)


def test_skip_fires_an_on_time_due_time_and_drops_the_earlier_ones() -> None:
    due = DueFires(utc(2030, 1, 7, 10), 3, False, utc(2030, 1, 7, 10, 5))
    decision = fire_decision(due, policy="skip", now=utc(2030, 1, 7, 10, 0, 20), grace=GRACE)
    assert (decision.fire_at, decision.missed) == (utc(2030, 1, 7, 10), 2)


def test_a_single_on_time_fire_has_nothing_missed_under_either_policy() -> None:
    due = DueFires(utc(2030, 1, 7, 10), 1, False, utc(2030, 1, 7, 10, 5))
    for policy in ("coalesce", "skip"):
        decision = fire_decision(due, policy=policy, now=utc(2030, 1, 7, 10, 0, 5), grace=GRACE)
        assert (decision.fire_at, decision.missed) == (utc(2030, 1, 7, 10), 0)


# --- properties -------------------------------------------------------------------------------

EXPRESSIONS = [
    "* * * * *",
    "*/7 * * * *",
    "0 * * * *",
    "30 1 * * *",
    "30 2 * * *",
    "0 2,3 * * *",
    "15 0-4 * * *",
    "0 0 * * 0",
    "* * * * * */20",
]
ZONES = [NY, BERLIN, "Australia/Lord_Howe", "UTC", "America/Santiago"]
#: DST changes of 2030 in the zones above (UTC instants), where the interesting cases are.
CHANGES = [
    utc(2030, 3, 10, 7), utc(2030, 11, 3, 6), utc(2030, 3, 31, 1), utc(2030, 10, 27, 1),
    utc(2030, 4, 6, 15), utc(2030, 10, 5, 15), utc(2030, 4, 6, 3), utc(2030, 9, 8, 4),
]  # fmt: skip
moments = st.one_of(
    st.datetimes(
        min_value=datetime(2029, 1, 1), max_value=datetime(2031, 12, 31), timezones=st.just(UTC)
    ),
    st.builds(
        lambda change, minutes: change + timedelta(minutes=minutes),
        st.sampled_from(CHANGES),
        st.integers(-240, 240),
    ),
)


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(EXPRESSIONS), st.sampled_from(ZONES), moments)
def test_fires_increase_match_the_expression_and_never_repeat_a_wall_time(
    expression: str, zone: str, start: datetime
) -> None:
    spec = CronSpec(expression, zone)
    fires = next_fires(spec, start, 30)
    assert fires and fires[0] > start
    assert all(a < b for a, b in itertools.pairwise(fires))
    tz = ZoneInfo(zone)
    seen = [wall_time(f, tz) for f in fires]
    assert len(set(seen)) == len(seen)
    for fire in fires:
        wall = fire.astimezone(tz)
        # Either the wall time matches, or the fire stands for times skipped by a DST jump.
        jumped = wall.utcoffset() != (fire - timedelta(seconds=1)).astimezone(tz).utcoffset()
        assert croniter.match(expression, wall.replace(tzinfo=None)) or jumped


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(EXPRESSIONS), st.sampled_from(ZONES), moments, st.integers(1, 40))
def test_due_fires_agrees_with_stepping_one_fire_at_a_time(
    expression: str, zone: str, start: datetime, steps: int
) -> None:
    spec = CronSpec(expression, zone)
    fires = next_fires(spec, start, steps + 1)
    now = fires[-2] + (fires[-1] - fires[-2]) / 2  # between the last two
    due = due_fires(spec, fires[0], now)
    assert due.count == steps and due.latest == fires[-2] and due.next_after == fires[-1]
    assert latest_fire_at_or_before(spec, now) == fires[-2]
