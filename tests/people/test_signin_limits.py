from __future__ import annotations

from appliance.people.signin import SignInLimiter


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_wrong_guesses_for_one_name_from_one_address_are_refused_after_a_few() -> None:
    clock = Clock()
    limit = SignInLimiter(clock, pair=(5, 60.0), address=(30, 10.0))
    allowed = 0
    for _ in range(20):
        if limit.check("10.0.0.9", "ann") is None:
            allowed += 1
            limit.failed("10.0.0.9", "ann")
    assert allowed == 5
    assert limit.check("10.0.0.9", "ann") == 60  # one more a minute
    # The same name from another address, and another name from this one, are not locked out.
    assert limit.check("10.0.0.7", "ann") is None
    assert limit.check("10.0.0.9", "ben") is None
    clock.t += 60
    assert limit.check("10.0.0.9", "Ann") is None  # names are matched without case
    limit.failed("10.0.0.9", "ann")
    assert limit.check("10.0.0.9", "ann") is not None


def test_one_address_spraying_names_is_limited_too() -> None:
    limit = SignInLimiter(Clock(), pair=(5, 60.0), address=(30, 10.0))
    for i in range(30):
        assert limit.check("10.0.0.9", f"user{i}") is None
        limit.failed("10.0.0.9", f"user{i}")
    assert limit.check("10.0.0.9", "user99") == 10
    assert limit.check("10.0.0.8", "user99") is None


def test_a_success_clears_the_pair() -> None:
    limit = SignInLimiter(Clock(), pair=(2, 60.0), address=(30, 10.0))
    limit.failed("a", "ann")
    limit.succeeded("a", "ann")
    limit.failed("a", "ann")
    assert limit.check("a", "ann") is None


def test_one_name_spelled_many_ways_is_one_bucket_and_an_ipv6_network_is_one_address() -> None:
    limit = SignInLimiter(Clock(), pair=(2, 60.0), address=(30, 10.0))
    for spelling in ("alice", " Alice", "ＡＬＩＣＥ "):
        limit.failed("10.0.0.9", spelling)
    assert limit.check("10.0.0.9", "alice") is not None
    limit = SignInLimiter(Clock(), pair=(2, 60.0), address=(3, 10.0))
    for i in range(3):
        limit.failed(f"2001:db8:1:2::{i + 1}", f"user{i}")
    assert limit.check("2001:db8:1:2::99", "other") is not None  # the same /64
    assert limit.check("2001:db8:1:3::1", "other") is None


def test_right_passwords_do_not_use_up_an_offices_address() -> None:
    limit = SignInLimiter(Clock(), pair=(5, 60.0), address=(3, 10.0))
    for i in range(10):  # ten colleagues behind one NAT sign in, each counted first, then taken back
        assert limit.check("192.0.2.1", f"user{i}") is None
        limit.failed("192.0.2.1", f"user{i}")
        limit.succeeded("192.0.2.1", f"user{i}")
    assert limit.check("192.0.2.1", "user99") is None
