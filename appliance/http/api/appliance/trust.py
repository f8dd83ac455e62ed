"""Trusting the box's own certificate authority once (tls/trust.py): GET /trust/ca.crt (open:
the CA certificate only, never a key), GET /trust (open: its fingerprint, which the sign-in
page shows) and GET /admin/trust (the download's URL as a phone reaches it, and its QR code).
All three are 404 `no_box_ca` when the box serves the operator's certificate or plain HTTP."""

from __future__ import annotations

import ipaddress

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.errors import NotFound
from appliance.http.state import App
from appliance.tls.trust import DOWNLOAD, Trust


def _trust(app: App) -> Trust:
    if app.trust is None:
        raise NotFound("this box serves no certificate authority of its own", code="no_box_ca")
    return app.trust


async def ca(app: App, request: Request) -> Response:
    # application/x-x509-ca-cert: what Android and iOS offer to install, and Windows opens.
    return Response(_trust(app).pem, media_type="application/x-x509-ca-cert",
                    headers={"Content-Disposition": 'attachment; filename="appliance-ca.crt"'})


async def info(app: App, request: Request) -> Response:
    return JSONResponse({"fingerprint": _trust(app).fingerprint, "download": DOWNLOAD.lstrip("/")})


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


async def admin(app: App, request: Request) -> Response:
    trust = _trust(app)
    # The page opened on the box itself says 127.0.0.1: a phone scanning that reaches nothing.
    url = trust.url if _loopback(request.url.hostname or "") else f"{str(request.base_url).rstrip('/')}{DOWNLOAD}"
    import segno  # here: 9 MiB once imported, paid only when an operator opens this section
    return JSONResponse({"fingerprint": trust.fingerprint, "url": url,
                         "qr_svg": segno.make(url, error="m").svg_inline(scale=4, border=2)},
                        headers={"Cache-Control": "no-store"})
