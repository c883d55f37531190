"""Window arithmetic (``qstate.core.windows``) against brute force: Spark's ``window(t, size,
slide)`` with no offset, half-open windows, starts aligned to the slide, negative times too."""

from __future__ import annotations

from math import gcd

from hypothesis import example, given, settings
from hypothesis import strategies as st

from qstate.core.windows import (
    ALL_WINDOWS,
    first_open_start,
    first_window_of,
    last_window_of,
    pane_ms,
    pane_tag,
    window_starts,
)

times = st.integers(-5_000, 5_000)


@st.composite
def size_slide(draw: st.DrawFn) -> tuple[int, int]:
    size = draw(st.integers(1, 120))
    slide = draw(st.integers(1, size))
    return size, slide


def brute_starts(t: int, size: int, slide: int) -> list[int]:
    """Every multiple of ``slide`` s with s <= t < s + size, by trying them all."""
    lo, hi = t - size - 2 * slide, t + 2 * slide
    candidates = [s for s in range(lo - lo % slide, hi + 1, slide)]
    return [s for s in candidates if s % slide == 0 and s <= t < s + size]


@settings(max_examples=400)
@given(times, size_slide())
@example(-1, (50, 20))
@example(-50, (50, 20))
@example(0, (50, 20))
@example(49, (50, 20))
@example(-7, (10, 10))
def test_window_starts_first_and_last(t: int, ss: tuple[int, int]) -> None:
    size, slide = ss
    expected = brute_starts(t, size, slide)
    assert expected, "every event is in at least one window when slide <= size"
    assert window_starts(t, size, slide) == expected
    assert first_window_of(t, size, slide) == expected[0]
    assert last_window_of(t, slide) == expected[-1]


def test_size_50_slide_20_by_hand() -> None:
    assert pane_ms(50, 20) == 10
    assert window_starts(0, 50, 20) == [-40, -20, 0]
    assert window_starts(49, 50, 20) == [0, 20, 40]
    assert window_starts(50, 50, 20) == [20, 40]
    assert window_starts(-1, 50, 20) == [-40, -20]
    assert window_starts(-41, 50, 20) == [-80, -60]
    # tumbling: slide == size, one window
    assert window_starts(-1, 10, 10) == [-10]
    assert window_starts(10, 10, 10) == [10]


@settings(max_examples=300)
@given(times, size_slide())
def test_first_open_start_is_the_oldest_window_ending_after_the_watermark(
        late: int, ss: tuple[int, int]) -> None:
    size, slide = ss
    s = first_open_start(late, size, slide)
    assert s % slide == 0
    assert s + size > late
    assert s - slide + size <= late


def brute_pane_tag(pane: int, size: int, slide: int, late: int) -> int | None:
    g = gcd(size, slide)
    # every event of the pane is in the same windows (what makes a pane a unit)
    sets = {tuple(brute_starts(t, size, slide)) for t in range(pane, pane + g)}
    assert len(sets) == 1
    (windows,) = sets
    open_ = [s for s in windows if s + size > late]  # window end after the late watermark
    if not open_:
        return None
    if len(open_) == len(windows):
        return ALL_WINDOWS
    # the open windows are the newest ones: a suffix of the list
    assert list(windows[len(windows) - len(open_):]) == open_
    return open_[0]


@settings(max_examples=400)
@given(st.integers(-300, 300), size_slide(), st.integers(-400, 400))
@example(0, (50, 20), 0)
@example(0, (50, 20), 10)
@example(0, (50, 20), 11)
@example(0, (50, 20), 30)
@example(0, (50, 20), 31)
@example(0, (50, 20), 50)
@example(-10, (50, 20), -20)
def test_pane_tag(k: int, ss: tuple[int, int], late: int) -> None:
    size, slide = ss
    g = pane_ms(size, slide)
    assert size % g == 0 and slide % g == 0
    pane = k * g
    assert pane_tag(pane, size, slide, late) == brute_pane_tag(pane, size, slide, late)


def test_pane_tag_by_hand() -> None:
    # size 50, slide 20, pane 10: pane [0, 10) is in windows -40, -20, 0 (ends 10, 30, 50)
    assert pane_tag(0, 50, 20, 0) == ALL_WINDOWS
    assert pane_tag(0, 50, 20, 9) == ALL_WINDOWS
    assert pane_tag(0, 50, 20, 10) == -20  # window -40 closed (end 10 <= 10)
    assert pane_tag(0, 50, 20, 30) == 0
    assert pane_tag(0, 50, 20, 49) == 0
    assert pane_tag(0, 50, 20, 50) is None
    # pane [10, 20) is in windows -20, 0 (ends 30, 50)
    assert pane_tag(10, 50, 20, 29) == ALL_WINDOWS
    assert pane_tag(10, 50, 20, 30) == 0
    assert pane_tag(-100, 50, 20, 0) is None
