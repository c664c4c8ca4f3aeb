"""The rate window of dispatcher.lag: ingress and ack rates, drain time and trend, driven
by a fake monotonic clock (plain floats), no loop and no disk."""

from __future__ import annotations

import pytest

from dispatcher.lag import NO_RATES, RATE_WINDOW_S, Rates, RateWindow, Trend, trend_of


def feed(window: RateWindow, seconds: float, step: float, ingress: float, acks: float) -> None:
    """Sample every ``step`` s for ``seconds``: the head grows by ``ingress``/s and the
    acknowledged total by ``acks``/s, from head 1000, acked 900."""
    t = 0.0
    while t <= seconds + 1e-9:
        window.observe(t, 1000 + round(ingress * t), 900 + round(acks * t))
        t += step


def test_rates_over_the_window_at_a_steady_pace() -> None:
    """Scenario: 30 s of heartbeats every 0.5 s; 50 records/s appended, 30/s acked.
    Expected: the rates are 50 and 30 (measured over about the last 10 s), the lag grows,
    and it never drains at these rates."""
    window = RateWindow()
    feed(window, 30, 0.5, ingress=50, acks=30)
    rates = window.rates()
    assert rates.ingress == pytest.approx(50, rel=0.01)
    assert rates.acked == pytest.approx(30, rel=0.01)
    assert RATE_WINDOW_S <= rates.span_s <= RATE_WINDOW_S + 1.0
    assert rates.trend is Trend.GROWING
    assert rates.drain_s(700) is None


def test_the_window_forgets_what_is_older() -> None:
    """Scenario: 20 s at 100/s in and out, then 20 s with nothing appended and 40/s acked.
    Expected: the rates show only the last window: ingress 0, acks 40, lag shrinking,
    drain = lag / 40."""
    window = RateWindow()
    t = 0.0
    head = acked = 0
    while t < 40:
        head += 50 if t < 20 else 0
        acked += 50 if t < 20 else 20
        window.observe(t, head, acked)
        t += 0.5
    rates = window.rates()
    assert rates.ingress == 0
    assert rates.acked == pytest.approx(40, rel=0.06)
    assert rates.trend is Trend.SHRINKING
    assert rates.drain_s(400) == pytest.approx(400 / rates.acked)


def test_samples_are_bounded_whatever_the_interval() -> None:
    """Scenario: 60 s of ticks every 10 ms. Expected: the window keeps about two samples
    per second of its span, not 1,000, and the rates are still right."""
    window = RateWindow()
    feed(window, 60, 0.01, ingress=10, acks=10)
    assert len(window._samples) <= 2 * RATE_WINDOW_S + 3
    assert window.rates().ingress == pytest.approx(10, rel=0.02)


def test_rates_before_two_samples_and_a_clock_that_goes_back() -> None:
    """One sample: no rates yet (0, steady). A sample from the past is ignored."""
    window = RateWindow()
    assert window.rates() is NO_RATES
    window.observe(5.0, 100, 100)
    assert window.rates() is NO_RATES
    window.observe(4.0, 0, 0)
    window.observe(6.0, 110, 105)
    assert (window.rates().ingress, window.rates().acked) == (10, 5)


@pytest.mark.parametrize(
    ("before", "now", "trend"),
    [
        (0, 0, Trend.STEADY),
        (0, 10, Trend.STEADY),  # within 10 records: batches in flight
        (0, 11, Trend.GROWING),
        (1000, 1050, Trend.STEADY),  # within 5 % of the larger lag
        (1000, 1060, Trend.GROWING),
        (1000, 940, Trend.SHRINKING),
        (30, 0, Trend.SHRINKING),
    ],
)
def test_trend_ignores_noise(before: int, now: int, trend: Trend) -> None:
    """The lag's change is a trend only past max(10 records, 5 % of the larger lag)."""
    assert trend_of(before, now) is trend


@pytest.mark.parametrize(
    ("ingress", "acked", "lag", "drain"),
    [
        (10.0, 30.0, 100, 5.0),
        (10.0, 10.0, 100, None),
        (30.0, 10.0, 100, None),
        (30.0, 10.0, 0, 0.0),
        (0.0, 0.0, 0, 0.0),
    ],
)
def test_drain_time(ingress: float, acked: float, lag: int, drain: float | None) -> None:
    """drain_s = lag / (acks - ingress) when positive; 0 when caught up; else None."""
    assert Rates(ingress, acked, Trend.STEADY, 10.0).drain_s(lag) == drain


def test_a_fast_heartbeat_samples_a_few_times_a_second() -> None:
    """A window wants a sample only a quarter of its spacing after the last one."""
    window = RateWindow(spacing_s=1.0)
    assert window.wants(0.0)
    window.observe(0.0, 0, 0)
    assert not window.wants(0.2)
    assert window.wants(0.25)


def _ticks(phases: list[tuple[float, float, float]]) -> list[tuple[float, int, int]]:
    """Ticks every 0.5 s through ``phases`` of (seconds, ingress/s, acks/s), from head
    1000, acked 900: (time, head, acknowledged total) at each tick."""
    out, t, head, acked = [(0.0, 1000, 900)], 0.0, 1000.0, 900.0
    for seconds, ingress, acks in phases:
        for _ in range(round(seconds / 0.5)):
            t += 0.5
            head += ingress * 0.5
            acked += acks * 0.5
            out.append((t, round(head), round(acked)))
    return out


def _windows(ticks: list[tuple[float, int, int]]) -> tuple[RateWindow, RateWindow]:
    """One window that observes every tick, and one that only holds when nothing moved
    (as an idle subscription's tick does)."""
    observed, held = RateWindow(), RateWindow()
    last: tuple[int, int] | None = None
    for t, head, acked in ticks:
        observed.observe(t, head, acked)
        if (head, acked) == last:
            held.hold(t)
        else:
            held.observe(t, head, acked)
        last = (head, acked)
    return observed, held


@pytest.mark.parametrize(
    ("phases", "ingress", "acked"),
    [
        ([(10, 100, 80), (20, 0, 0)], 0, 0),  # idle for the whole window
        ([(10, 100, 100), (5, 0, 0)], 50, 50),  # idle for half of it
        ([(30, 0, 0), (5, 100, 60)], 50, 30),  # busy after a long idle stretch
        ([(2, 100, 0), (3, 0, 50)] * 12, 40, 30),  # in and acks in turns
        ([(2, 100, 0), (3, 0, 50), (3, 0, 0)] * 8, 20, 15),  # with idle stretches
        ([(0.5, 0, 0), (9.5, 0, 0)], 0, 0),  # idle from the start
    ],
)
def test_holding_an_idle_window_gives_the_rates_of_observing_it(
    phases: list[tuple[float, float, float]], ingress: float, acked: float
) -> None:
    """Scenario: the same ticks into a window that observes every tick and into one that
    only holds on ticks where nothing moved. Expected: both give the rates the phases
    make over the last 10 s, the same trend, and the held one spans the window too."""
    observed, held = _windows(_ticks(phases))
    a, b = observed.rates(), held.rates()
    assert a.ingress == pytest.approx(ingress, abs=0.5)
    assert a.acked == pytest.approx(acked, abs=0.5)
    assert b.ingress == pytest.approx(a.ingress, abs=0.5)
    assert b.acked == pytest.approx(a.acked, abs=0.5)
    assert b.trend is a.trend
    assert b.span_s == pytest.approx(a.span_s, abs=1.0)


def test_a_hold_counts_as_a_sample_and_needs_one_first() -> None:
    """A hold before any observation changes nothing (no rates, still wanted); after one,
    a hold makes the window not want another sample for a quarter of the spacing, and
    gives an idle partition rates of 0 over the held span."""
    window = RateWindow(spacing_s=1.0)
    window.hold(1.0)
    assert window.rates() is NO_RATES
    assert window.wants(1.0)
    window.observe(2.0, 100, 90)
    window.hold(4.0)
    assert not window.wants(4.2)
    assert window.wants(4.25)
    rates = window.rates()
    assert (rates.ingress, rates.acked, rates.trend, rates.span_s) == (0, 0, Trend.STEADY, 2.0)
