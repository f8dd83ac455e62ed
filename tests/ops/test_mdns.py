"""The mDNS announcer without a network (ops/mdns.py): which addresses the name carries, and
that a failure is logged once while the box goes on (tests/ops/test_mdns_live.py resolves a
real announcement in a network namespace of its own)."""

from __future__ import annotations

import logging

import pytest
from helpers.polling import wait_until

from appliance.http.reach import Box
from appliance.ops.mdns import Announcer, Ip, addresses

IPS = [Ip("127.0.0.1", True), Ip("::1", True), Ip("192.168.1.20", False), Ip("10.0.0.7", False),
       Ip("2001:db8::20", False)]


def test_a_wildcard_announces_the_machines_addresses_but_loopback() -> None:
    assert addresses("0.0.0.0", IPS) == ["10.0.0.7", "192.168.1.20"]
    assert addresses("", IPS) == ["10.0.0.7", "192.168.1.20"]
    assert addresses("::", IPS) == ["10.0.0.7", "192.168.1.20", "2001:db8::20"]  # both families


def test_one_listening_address_is_the_one_announced() -> None:
    assert addresses("192.168.1.20", IPS) == ["192.168.1.20"]
    assert addresses("127.0.0.1", IPS) == ["127.0.0.1"]
    assert addresses("box.example", IPS) == []  # a host name: DNS answers for it


def test_with_only_loopback_the_name_still_resolves_on_the_box() -> None:
    only_lo = [Ip("127.0.0.1", True), Ip("::1", True)]
    assert addresses("0.0.0.0", only_lo) == ["127.0.0.1"]
    assert addresses("::", only_lo) == ["127.0.0.1", "::1"]


def test_a_failure_is_logged_once_and_the_worker_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    announcer = Announcer(Box("office"), "0.0.0.0", ips=lambda: [])  # no network yet
    with caplog.at_level(logging.WARNING, logger="appliance.ops.mdns"):
        announcer.start()  # returns at once: the first try runs on the thread
        wait_until(lambda: announcer.state != "starting", 10, "the first try")
        assert announcer.state == "not announced: no address to announce"
        announcer.tick()  # the minute's retry, failing again
        assert announcer.health().alive
        announcer.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "office.local is not announced" in warnings[0] and "serves anyway" in warnings[0]
    assert announcer.state == "stopped" and not announcer.health().alive
