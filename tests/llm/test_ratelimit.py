"""The shared rate limit's reservation arithmetic (the Ray actor only holds this state).

A reservation is the absolute time the caller may start, so the waits are start - now."""

import pytest

from cpr_ray.llm.ratelimit import Buckets


def test_requests_per_second_spaces_reservations():
    b = Buckets(requests_per_second=4, tokens_per_minute=None)
    starts = [b.reserve(100, now=10.0) for _ in range(5)]
    assert starts == pytest.approx([10.0, 10.25, 10.5, 10.75, 11.0])
    assert b.reserve(100, now=20.0) == 20.0  # idle time is not banked beyond now


def test_tokens_per_minute_and_both_limits():
    b = Buckets(requests_per_second=None, tokens_per_minute=6000)
    assert b.reserve(1000, now=0.0) == 0.0
    assert b.reserve(1000, now=0.0) == pytest.approx(10.0)  # 1000 tokens = 10 s of budget
    both = Buckets(requests_per_second=100, tokens_per_minute=60_000)
    assert both.reserve(5000, now=0.0) == 0.0
    assert both.reserve(10, now=0.0) == pytest.approx(5.0)  # the token bucket is the binding one


def test_no_limits_never_wait():
    b = Buckets(None, None)
    assert all(b.reserve(10**6, now=1.0) == 1.0 for _ in range(10))
