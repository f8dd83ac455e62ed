"""The box's address from the config: its name on the LAN, its port, and whether it serves
HTTPS, for the announcer (ops/mdns.py), the links it hands out (http/reach.py) and the
terminal's invite link (ops/person.py)."""

from __future__ import annotations

from appliance.config import Config
from appliance.http.reach import Box
from appliance.tls.mode import Mode, mode_of


def scheme(cfg: Config) -> str:
    """https when the box serves TLS: an operator's certificate, or its own (tls/mode.py)."""
    return "http" if mode_of(cfg) is Mode.PLAIN else "https"


def box(cfg: Config) -> Box:
    return Box(cfg.box_name, cfg.port, scheme(cfg))
