from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loops.services.locks import normalize_path, paths_conflict

segment = st.sampled_from(["a", "b", "src", "app", "x.py"])
paths = st.lists(segment, min_size=0, max_size=4).map("/".join)


@pytest.mark.parametrize(
    ("a", "b", "conflict"),
    [
        ("src", "src", True),
        ("src", "src/app", True),
        ("src/app", "src", True),
        ("src", "srcx", False),
        ("src/a", "src/b", False),
        ("", "anything", True),
    ],
)
def test_paths_conflict_when_equal_or_nested(a: str, b: str, conflict: bool) -> None:
    assert paths_conflict(a, b) is conflict


@given(paths, paths)
def test_conflict_is_symmetric(a: str, b: str) -> None:
    assert paths_conflict(a, b) == paths_conflict(b, a)


def test_normalize_path_cleans_and_refuses_escapes() -> None:
    assert normalize_path("./src//app/") == "src/app"
    assert normalize_path("/") == ""
    with pytest.raises(ValueError, match="escapes"):
        normalize_path("../etc")
