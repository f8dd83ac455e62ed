"""Links never loopback (http/reach.py): an invite or share link made from a request to a
loopback address names the box as a phone finds it (<box_name>.local and its port); any
other request's links name the host it came by. In-process, the fake model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import build
from starlette.requests import Request
from starlette.testclient import TestClient

from appliance.http.people import People
from appliance.http.reach import Box, invite_link, join, loopback, origin
from appliance.people.db import Database
from appliance.people.passwords import Hasher


def request(host: str, scheme: str = "http") -> Request:
    return Request({"type": "http", "scheme": scheme, "server": ("127.0.0.1", 8080), "path": "/", "root_path": "",
                    "query_string": b"", "headers": [(b"host", host.encode())]})


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "LOCALHOST.", "app.localhost", "::1",
                                  "[::1]", "::ffff:127.0.0.1"])
def test_loopback_names(host: str) -> None:
    assert loopback(host)


@pytest.mark.parametrize("host", ["192.168.1.20", "appliance.local", "chat.example.com", "::", "fe80::1", ""])
def test_names_people_reach(host: str) -> None:
    assert not loopback(host)


def test_join_leaves_out_the_port_its_scheme_implies() -> None:
    assert join("http", "a.local", 80) == "http://a.local"
    assert join("https", "a.local", 443) == "https://a.local"
    assert join("https", "a.local", 8080) == "https://a.local:8080"
    assert Box("office", 8443, "https").url == "https://office.local:8443/"
    assert invite_link("http://a.local", "T") == "http://a.local/#invite=T"


def test_a_loopback_request_gets_the_box_name_with_the_box_port_and_its_own_scheme() -> None:
    box = Box("office", 8080)
    # An SSH tunnel's local port (9000) is not the box's: the link carries the box's.
    assert origin(request("localhost:9000"), box) == "http://office.local:8080"
    assert origin(request("127.0.0.1:8080", "https"), box) == "https://office.local:8080"
    assert origin(request("[::1]:8080"), box) == "http://office.local:8080"
    assert origin(request("127.0.0.1", "https"), Box("office", 443)) == "https://office.local"


def test_any_other_request_keeps_the_host_it_came_by() -> None:
    box = Box("office", 8080)
    assert origin(request("192.168.1.20:8080"), box) == "http://192.168.1.20:8080"
    assert origin(request("chat.example.com", "https"), box) == "https://chat.example.com"
    assert origin(request("office.local:8080"), box) == "http://office.local:8080"


@pytest.fixture
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    people = People(Database(tmp_path_factory.mktemp("state")), hasher=Hasher(n=2**10))
    with TestClient(build(FakeModel, people=people), base_url="http://localhost", client=("127.0.0.1", 50000)) as c:
        yield c


def test_invite_links_and_their_qr_code_name_the_box_from_this_machine(client: TestClient) -> None:
    made = client.post("/admin/people", json={"name": "Ann"}).json()
    assert made["invite_url"].startswith("http://appliance.local:8080/#invite=")
    again = client.post(f"/admin/people/{made['person']['id']}/invite").json()
    assert again["invite_url"].startswith("http://appliance.local:8080/#invite=")
    assert "<svg" in again["invite_qr_svg"]
    # The operator at the box by its LAN address (a browser on the box, typed by address): kept.
    by_address = client.post("/admin/people", json={"name": "Ben"}, headers={"host": "192.168.1.20:8080"}).json()
    assert by_address["invite_url"].startswith("http://192.168.1.20:8080/#invite=")
    # Through an SSH tunnel (ssh -L 9000:localhost:8080): the box's name and port, not the tunnel's.
    tunnel = client.post("/admin/people", json={"name": "Cy"}, headers={"host": "127.0.0.1:9000"}).json()
    assert tunnel["invite_url"].startswith("http://appliance.local:8080/#invite=")
