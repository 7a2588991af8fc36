"""retry_delay's policy (shoal/_backoff.py): a pure function attempt -> seconds, checked by
properties: capped, non-decreasing without jitter, jitter bounded and reproducible."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import shoal
from shoal._backoff import check_retry_delay, retry_delay

bases = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
factors = st.floats(min_value=1.0, max_value=10.0, allow_nan=False)
caps = st.floats(min_value=0.0, max_value=1e4, allow_nan=False)
attempts = st.integers(min_value=1, max_value=5000)


def _policy(base, factor, cap, jitter=0.0):
    return shoal.Backoff(base=base, factor=factor, cap=max(cap, base), jitter=jitter)


@given(bases, factors, caps, st.floats(min_value=0.0, max_value=0.99), attempts, st.text(max_size=8))
def test_never_past_the_cap_nor_below_zero(base, factor, cap, jitter, attempt, seed):
    b = _policy(base, factor, cap, jitter)
    assert 0.0 <= b.delay(attempt, seed) <= b.cap


@given(bases, factors, caps, attempts)
def test_without_jitter_non_decreasing_and_exact(base, factor, cap, attempt):
    b = _policy(base, factor, cap)
    assert b.delay(attempt) <= b.delay(attempt + 1)
    if attempt < 50:
        assert b.delay(attempt) == pytest.approx(min(b.cap, base * factor ** (attempt - 1)))


@given(bases, factors, caps, st.floats(min_value=0.0, max_value=0.99), attempts, st.integers())
def test_jitter_is_bounded_and_reproducible(base, factor, cap, jitter, attempt, seed):
    plain = _policy(base, factor, cap).delay(attempt)
    b = _policy(base, factor, cap, jitter)
    d = b.delay(attempt, seed)
    assert plain * (1 - jitter) - 1e-9 <= d <= min(b.cap, plain * (1 + jitter)) + 1e-9
    assert d == b.delay(attempt, seed)  # same seed, same delay: a resume waits what the run would


def test_jitter_spreads_tasks_that_fail_together():
    b = shoal.Backoff(base=10, factor=1, cap=20, jitter=0.5)
    delays = {b.delay(1, seed=f"p0.s0.t{i}") for i in range(50)}
    assert len(delays) > 45 and min(delays) >= 5 and max(delays) <= 15


def test_a_number_is_a_fixed_delay_and_none_is_none():
    assert [retry_delay(2.5, a) for a in (1, 2, 9)] == [2.5, 2.5, 2.5]
    assert retry_delay(None, 3) == 0.0
    assert retry_delay(shoal.Backoff(base=1, factor=2, cap=60), 4) == 8.0


@pytest.mark.parametrize("kwargs, word", [
    ({"base": -1}, "base"), ({"factor": 0.5}, "factor"), ({"jitter": 1.0}, "jitter"),
    ({"base": 5, "cap": 1}, "cap"), ({"cap": float("inf")}, "cap")])
def test_bad_backoff_names_the_field(kwargs, word):
    with pytest.raises(ValueError, match=word):
        shoal.Backoff(**kwargs)


@pytest.mark.parametrize("value", [-1, float("nan"), "5", True])
def test_bad_retry_delay_names_the_culprit(value):
    with pytest.raises(ValueError, match="task x: retry_delay"):
        check_retry_delay(value, "task x")
