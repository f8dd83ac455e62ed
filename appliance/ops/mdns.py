"""Found by name: the box announces itself on the LAN by mDNS/DNS-SD (python-zeroconf, what
Home Assistant announces itself with): an A/AAAA record `<box_name>.local` and a service
"Office chat (<box_name>)" of type `_http._tcp` (`_https._tcp` when it serves HTTPS) with
TXT path=/, so a phone's browser opens `http://appliance.local:8080/` and a service browser
lists the chat page.

It runs on a thread of its own and never holds up the start: probing for the name takes
~1.6 s (three probes 250 ms apart, then the announcements). A failure (no multicast route,
no interface up yet) is logged once and the box serves anyway; it tries again every minute,
so a Pi whose network comes up after the service started is found once it does. The same
tick re-reads the machine's addresses: a DHCP lease that moves the box moves its name.

Beside avahi-daemon on the same host both answer on port 5353 (each binds it with
SO_REUSEADDR and SO_REUSEPORT), each for its own names: avahi for the host name, this for
box_name, which must then differ from the host name.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from appliance.http.reach import Box
from appliance.workers import Worker

log = logging.getLogger(__name__)
RETRY_S = 60.0  # a failed announcement is tried again, and the addresses re-read, this often
TITLE = "Office chat"
WILDCARDS = {"": 4, "0.0.0.0": 4, "::": 6}  # listening on every address: IPv4 only, or both


@dataclass(frozen=True, slots=True)
class Ip:
    """One address of the machine's, as ifaddr lists them."""

    address: str
    loopback: bool


def machine_ips() -> list[Ip]:
    import ifaddr  # zeroconf's own dependency, imported where it is used

    ips = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            text = ip.ip if isinstance(ip.ip, str) else ip.ip[0]
            parsed = ipaddress.ip_address(text)
            if parsed.version == 6 and parsed.is_link_local:
                continue  # fe80:: needs its interface to be reached: a name cannot carry that
            ips.append(Ip(text, parsed.is_loopback))
    return ips


def addresses(host: str, ips: list[Ip]) -> list[str]:
    """The addresses the name resolves to: the one the box listens on, or with a wildcard every
    address of the machine's (IPv6 ones for '::' only); loopback ones only when there is no
    other (no network yet, or a test's own namespace), so the name still resolves on the box."""
    if host not in WILDCARDS:
        try:
            return [str(ipaddress.ip_address(host))]
        except ValueError:
            return []  # a host name: its own resolver answers for it
    v6 = WILDCARDS[host] == 6
    usable = [ip for ip in ips if ":" not in ip.address or v6]
    outside = [ip.address for ip in usable if not ip.loopback]
    return sorted(set(outside or [ip.address for ip in usable]))


class Announcer(Worker[None]):
    """Announces `box` on the LAN from its thread; `state` says how that went, for /admin/status."""

    def __init__(self, box: Box, host: str, ips: Callable[[], list[Ip]] = machine_ips) -> None:
        super().__init__("mdns", every=RETRY_S)
        self.box, self.host, self._ips = box, host, ips
        self.state = "starting"
        self._zc: Any = None  # zeroconf.Zeroconf while announced
        self._info: Any = None  # its ServiceInfo
        self._told = False  # the failure is in the journal already

    def start(self) -> None:
        super().start()
        self.submit(None)  # the first try at once, on the thread

    def handle(self, item: None) -> None:
        self._try()

    def tick(self) -> bool:
        if self._info is None:
            self._try()
        elif self._addresses() != self._info.parsed_addresses():
            self._try()  # moved (a new DHCP lease): announced again under the new addresses
        return True

    def end(self) -> None:
        self._withdraw()
        self.state = "stopped"

    def _addresses(self) -> list[str]:
        return addresses(self.host, self._ips())

    def _try(self) -> None:
        self._withdraw()
        try:
            self._announce()
        except Exception as e:  # zeroconf's errors, OSError for sockets: none may stop the box
            self._withdraw()
            self.state = f"not announced: {e or type(e).__name__}"
            if not self._told:
                log.warning("mDNS: %s is not announced (%s); the box serves anyway, at its address, "
                            "and tries again every %.0f s", self.box.host, e or type(e).__name__, RETRY_S)
                self._told = True
            return
        self.state = "announced"
        log.info("mDNS: announced %s (%s) as %r", self.box.host, ", ".join(self._info.parsed_addresses()),
                 self._info.name)

    def _announce(self) -> None:
        from zeroconf import ServiceInfo, Zeroconf  # 2 MiB, imported only by a box that announces

        found = self._addresses()
        if not found:
            raise OSError("no address to announce")
        kind = f"_{self.box.scheme}._tcp.local."
        info = ServiceInfo(kind, f"{TITLE} ({self.box.name}).{kind}", port=self.box.port,
                           properties={"path": "/"}, server=f"{self.box.host}.", parsed_addresses=found)
        self._zc = Zeroconf()
        # A second box's service of the same name is renamed "... (2)"; two boxes with one
        # box_name answer for one host name, which is why it is a setting.
        self._zc.register_service(info, allow_name_change=True)
        self._info = info

    def _withdraw(self) -> None:
        zc, self._zc, self._info = self._zc, None, None
        if zc is None:
            return
        try:
            zc.unregister_all_services()  # the goodbye: browsers drop the entry at once
        except Exception as e:
            log.debug("mDNS: goodbye not sent: %s", e)
        zc.close()
