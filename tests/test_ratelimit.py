"""The shared rate limit's reservation arithmetic (the Ray actor only holds this state)."""

import pytest

from cpr_ray.llm.ratelimit import Buckets


def test_requests_per_second_spaces_reservations():
    b = Buckets(requests_per_second=4, tokens_per_minute=None)
    waits = [b.reserve(100, now=10.0) for _ in range(5)]
    assert waits == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert b.reserve(100, now=20.0) == 0.0  # idle time is not banked beyond now


def test_tokens_per_minute_and_both_limits():
    b = Buckets(requests_per_second=None, tokens_per_minute=6000)
    assert b.reserve(1000, now=0.0) == 0.0
    assert b.reserve(1000, now=0.0) == pytest.approx(10.0)  # 1000 tokens = 10 s of budget
    both = Buckets(requests_per_second=100, tokens_per_minute=60_000)
    assert both.reserve(5000, now=0.0) == 0.0
    assert both.reserve(10, now=0.0) == pytest.approx(5.0)  # the token bucket is the binding one


def test_no_limits_never_wait():
    b = Buckets(None, None)
    assert all(b.reserve(10**6, now=1.0) == 0.0 for _ in range(10))
