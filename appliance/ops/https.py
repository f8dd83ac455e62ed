"""HTTPS for `appliance serve`, as the `tls` setting asks (tls/mode.py): the operator's
certificate, or the box's own CA made in state_dir/tls at first start with a server
certificate renewed by its own thread; the listener (tls/listener.py) that speaks TLS and
redirects plain HTTP on the same port, the optional plain port, HSTS, and the start-up line
that gives the CA's fingerprint."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from appliance.config import Config, ConfigError
from appliance.tls import names
from appliance.tls.authority import Files
from appliance.tls.listener import https_protocol, redirect_protocol
from appliance.tls.mode import Mode, mode_of
from appliance.tls.renewal import Renewer
from appliance.tls.trust import DOWNLOAD, Trust

log = logging.getLogger(__name__)


def context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])  # uvicorn speaks HTTP/1.1 only
    ctx.load_cert_chain(cert, key)
    return ctx


@dataclass(slots=True)
class Https:
    mode: Mode
    cert: Path
    key: Path
    deadline_s: float  # a plain request's head must come within this (request_deadline_s)
    port: int
    http_port: int = 0
    trust: Trust | None = None  # the box's own CA (None: the operator's certificate)
    renewer: Renewer | None = None
    current: ssl.SSLContext | None = None

    def reload(self) -> None:
        """A new context with the files as they are now: new connections take it (the
        listener asks for it per connection), those already open keep theirs."""
        self.current = context(self.cert, self.key)

    def context(self) -> ssl.SSLContext:
        assert self.current is not None
        return self.current

    def protocol(self, inner: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
        return https_protocol(inner, self.context, self.deadline_s)

    async def plain_listener(self, host: str) -> asyncio.AbstractServer | None:
        """The redirecting plain-HTTP port, if asked for; a port we may not bind is a warning,
        not a failed start (https on `port` still serves)."""
        if not self.http_port:
            return None
        try:
            return await asyncio.get_running_loop().create_server(
                redirect_protocol(self.port, self.deadline_s), host, self.http_port)
        except OSError as e:
            log.warning("http_port %d: cannot listen (%s); plain http on port %d still redirects",
                        self.http_port, e, self.port)
            return None


def prepare(cfg: Config, clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> Https | None:
    """What the config asks for, ready to serve (None: plain HTTP). The box's CA is made, and
    its server certificate renewed if due, here: before the model loads."""
    mode = mode_of(cfg)
    if mode is Mode.PLAIN:
        return None
    if mode is Mode.OWN:
        https = Https(mode, Path(cfg.tls_cert), Path(cfg.tls_key), cfg.request_deadline_s, cfg.port, cfg.http_port)
        https.reload()
        return https
    if not cfg.state_dir:
        raise ConfigError("config key 'tls': the box's own certificate authority is kept in state_dir, which is off; "
                          "set state_dir, or tls_cert and tls_key, or tls = off")
    files = Files(Path(cfg.state_dir) / "tls")
    wanted = _wanted(cfg)
    made = files.ensure_ca(wanted().dns, clock())
    trust = Trust(files.ca_cert.read_bytes(), _reach(cfg))
    https = Https(mode, files.cert, files.key, cfg.request_deadline_s, cfg.port, cfg.http_port, trust)
    https.renewer = Renewer(files, wanted, https.reload, clock)
    https.renewer.check()
    try:
        https.reload()
    except ssl.SSLError:  # a key and certificate that do not match: a crash between their two writes
        files.issue(wanted(), clock())
        https.reload()
    _announce(trust, files, made)
    return https


def _wanted(cfg: Config) -> Callable[[], names.Names]:
    """The names the server certificate should carry now: the machine's, and allowed_hosts'
    exact names (a '.example.com' or '*' entry names no one host)."""
    extra = frozenset(h.lower() for h in cfg.allowed_hosts if h and not h.startswith(".") and h != "*")

    def now() -> names.Names:
        found = names.current(cfg.box_name)
        return names.Names(found.dns | extra, found.ips)

    return now


def _reach(cfg: Config) -> str:
    """The download as a phone on the LAN reaches it (the page opened on the box itself says 127.0.0.1)."""
    return f"https://{cfg.box_name}.local{'' if cfg.port == 443 else f':{cfg.port}'}{DOWNLOAD}"


def _announce(trust: Trust, files: Files, made: bool) -> None:
    log.info("https with the box's own certificate authority (%s %s): people trust it once from %s or /admin; "
             "its SHA-256 fingerprint is %s", "made now in" if made else "kept in", files.folder, trust.url,
             trust.fingerprint)
